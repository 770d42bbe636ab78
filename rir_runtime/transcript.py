"""A readable transcript of one episode's event trace: steps, reviews, restores, the memory."""

from __future__ import annotations

from typing import Any


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def render_transcript(record: dict[str, Any]) -> str:
    out = [
        f"== {record['env']}/{record['task']} ({record['split']} variation {record['variation']}) | "
        f"method {record['method']} | controller {record['controller']} | policy {record['policy']}"
    ]
    for e in record["events"]:
        kind = e["type"]
        if kind == "reset":
            out += [f"Objective: {_short(e['objective'], 300)}", f"  C_0 saved | {_short(e['observation'])}"]
        elif kind == "step":
            flag = "   <- injected error (hidden from the agent)" if e.get("injected_error") else ""
            end = " [WON]" if e["won"] else " [LOST]" if e["lost"] else ""
            out.append(
                f"  [{e['t'] - 1:>2}] {e['action']}{flag}\n       -> {_short(e['observation'])} "
                f"(score {e['score']:g}){end}"
            )
        elif kind == "review":
            out.append(f"  ?? review ({e['trigger']}) at t={e['t']}: {e['decision']} - {_short(e['reason'], 90)}")
        elif kind == "locate":
            if "error" in e:
                out.append(f"  .. locate: {e['error']}")
            else:
                seg = e["segments"][e["segment"]]
                out.append(
                    f"  .. locate: segment {e['segment']} (checkpoints {seg[0]}-{seg[1] - 1}) -> step {e['step']}"
                )
        elif kind == "reflect":
            f = e["reflection"].get("failure")
            if f:
                out.append(
                    f"  !! reflect: when {_short(f['condition'], 60)}: '{f['action']}' -> {_short(f['outcome'], 60)}"
                )
        elif kind == "restore":
            extra = (
                f" (first injected error of that branch: step {e['first_error']})"
                if e.get("first_error") is not None
                else ""
            )
            out.append(f"  << restore to C_{e['to']} (k={e['k']}){extra}")
        elif kind in ("rollback_call", "tool_error", "respond", "restore_failed", "locate_fallback"):
            out.append(f"  -- {kind}: {_short(str({k: v for k, v in e.items() if k not in ('type', 't')}))}")
    mem = record.get("memory") or {}
    lines = [f"    known: {k}" for k in mem.get("env_knowledge", [])] + [
        f"    milestone: {m}" for m in mem.get("milestones", [])
    ]
    lines += [
        f"    failure: when {_short(f['condition'], 50)}: '{f['action']}' -> {_short(f['outcome'], 50)}; {f['lesson']}"
        for f in mem.get("failures", [])
    ]
    lines += [f"    note: {_short(n, 150)}" for n in mem.get("notes", [])]
    if lines:
        out += ["  Memory that survived the rollbacks:"] + lines
    out.append(
        f"== {'SUCCESS' if record['success'] else 'FAILURE'}: score {record['score']:g}, agent calls "
        f"{record['agent_calls']}, rollbacks {record['rollbacks']}, env steps {record['env_steps']}, "
        f"{record['wall_s']:.2f}s ({record['stop_reason']})"
    )
    return "\n".join(out)
