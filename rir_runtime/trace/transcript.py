"""A readable transcript of one episode's event trace: steps, reviews, restores, the memory."""

from __future__ import annotations

from rir_runtime.trace import (
    EpisodeRecord,
    Event,
    LocateEvent,
    ReflectEvent,
    ResetEvent,
    RestoreEvent,
    ReviewEvent,
    StepEvent,
)


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def event_lines(e: Event) -> list[str]:
    """How one event reads in a transcript."""
    if isinstance(e, ResetEvent):
        return [f"Objective: {_short(e.objective, 300)}", f"  C_0 saved | {_short(e.observation)}"]
    if isinstance(e, StepEvent):
        flag = "   <- injected error (hidden from the agent)" if e.injected_error else ""
        end = " [WON]" if e.won else " [LOST]" if e.lost else ""
        return [f"  [{e.t - 1:>2}] {e.action}{flag}\n       -> {_short(e.observation)} (score {e.score:g}){end}"]
    if isinstance(e, ReviewEvent):
        return [f"  ?? review ({e.trigger}) at t={e.t}: {e.decision} - {_short(e.reason, 90)}"]
    if isinstance(e, LocateEvent):
        a, b = e.segments[e.segment]
        return [f"  .. locate: segment {e.segment} (checkpoints {a}-{b - 1}) -> step {e.step}"]
    if isinstance(e, ReflectEvent):
        f = e.reflection.failure
        if not f:
            return []
        return [f"  !! reflect: when {_short(f.condition, 60)}: '{f.action}' -> {_short(f.outcome, 60)}"]
    if isinstance(e, RestoreEvent):
        extra = f" (first injected error of that branch: step {e.first_error})" if e.first_error is not None else ""
        return [f"  << restore to C_{e.to} (k={e.k}){extra}"]
    fields = {k: v for k, v in e.to_json().items() if k not in ("type", "t")}
    return [f"  -- {e.type}: {_short(str(fields))}"]


def render_transcript(record: EpisodeRecord) -> str:
    r = record
    out = [
        f"== {r.env}/{r.task} ({r.split} variation {r.variation}) | "
        f"method {r.method} | controller {r.controller} | policy {r.policy}"
    ]
    for event in r.events:
        out += event_lines(event)
    mem = r.memory
    lines = [f"    known: {k}" for k in mem.env_knowledge] + [f"    milestone: {m}" for m in mem.milestones]
    lines += [
        f"    failure: when {_short(f.condition, 50)}: '{f.action}' -> {_short(f.outcome, 50)}; {f.lesson}"
        for f in mem.failures
    ]
    lines += [f"    note: {_short(n, 150)}" for n in mem.notes]
    if lines:
        out += ["  Memory that survived the rollbacks:"] + lines
    out.append(
        f"== {'SUCCESS' if r.success else 'FAILURE'}: score {r.score:g}, agent calls {r.agent_calls}, "
        f"rollbacks {r.rollbacks}, env steps {r.env_steps}, {r.wall_s:.2f}s ({r.stop_reason})"
    )
    return "\n".join(out)
