"""The model-free pieces every controller may lean on: failure signals, the suspect step, the
reflection written for a restore point, and the safe defaults when a model's reply cannot be parsed."""

from __future__ import annotations

from dataclasses import dataclass

from rir_runtime.decisions import DecisionKind, Reflection, Review
from rir_runtime.prompts import DecisionContext, ending
from rir_runtime.signals import ERROR_OBSERVATION
from rir_runtime.structured import failure_record

# Verbs that only look or move: a failure is rarely caused by them (shopdb's read tools among them).
PASSIVE_VERBS = {
    "query",
    "lookup_customer",
    "list_orders",
    "get_order",
    "find_product",
    "get_stock",
    "list_warehouses",
    "look",
    "inventory",
    "examine",
    "read",
    "go",
    "wait",
    "check",
    "task",
    "score",
    "teleport",
    "take",
    "pick",
    "open",
    "close",
}


@dataclass(frozen=True)
class FailureSignal:
    """A visible sign of trouble; an `urgent` one is worth a recovery between scheduled reviews."""

    text: str
    urgent: bool = False


def failure_signal(ctx: DecisionContext, stall_steps: int = 8, loop_steps: int = 3) -> FailureSignal | None:
    """A visible sign of trouble in the branch: lost, an ending below the task's maximum score, a
    score drop, an LLM agent stuck repeating one action to the same reply (urgent: each names a
    state worse than before), an error reply, or a stall (which wait for a scheduled review)."""
    h = ctx.history
    if not h:
        return None
    last = h[-1]
    if last.lost:
        return FailureSignal(f"the episode was lost after '{last.action}'", urgent=True)
    if ctx.trigger == "terminal" and (ctx.max_score is not None and ctx.score < ctx.max_score):
        return FailureSignal(ending(ctx), urgent=True)  # ended below the maximum: a visible failure
    if len(h) >= 2 and last.score < h[-2].score:
        return FailureSignal(f"the score dropped after '{last.action}'", urgent=True)
    if len(h) >= loop_steps and len({(s.action, s.observation) for s in h[-loop_steps:]}) == 1:
        return FailureSignal(
            f"'{last.action}' repeated {loop_steps} times to the same reply: the agent is stuck", urgent=True
        )
    if ERROR_OBSERVATION.search(last.observation):
        return FailureSignal(f"'{last.action}' was not possible")
    if len(h) > stall_steps and h[-1].score <= h[-1 - stall_steps].score:
        return FailureSignal(f"no progress in {stall_steps} steps")
    return None


def suspect_step(ctx: DecisionContext) -> int:
    """The step most likely to have caused the trouble (its checkpoint is the restore target).

    A visible symptom that follows an action at once (lost, score drop) blames that action.
    Otherwise the error was silent: blame the latest committing action not already blamed in a
    remembered failure, walking further back on each new failure of the same kind.
    """
    h = ctx.history
    admissible = set(ctx.admissible)
    candidates = h
    if h and (h[-1].lost or (len(h) >= 2 and h[-1].score < h[-2].score)) and h[-1].index in admissible:
        # A symptom that names what the last action touched ("the almond bursts into flames") blames
        # that action; one that does not ("the dish is inedible") points further back.
        words = h[-1].action.lower().split()
        touched = words[-1] if len(words) > 1 else ""  # a bare verb ("combine") touches nothing by name
        if touched and touched in h[-1].observation.lower() and h[-1].action not in ctx.blamed_actions:
            return h[-1].index
        candidates = h[:-1]
    for step in reversed(candidates):
        verb = step.action.split(" ", 1)[0].lower()
        if step.index in admissible and verb not in PASSIVE_VERBS and step.action not in ctx.blamed_actions:
            if not ERROR_OBSERVATION.search(step.observation):
                return step.index
    return max(admissible) if admissible else 0


def reflection_for(ctx: DecisionContext, r: int) -> Reflection:
    """What survives a restore to checkpoint r: the step taken there as a conditioned failure,
    facts learned from failed actions, milestones of the abandoned suffix. No state claims."""
    h = ctx.history
    if not h:
        return Reflection()
    if r >= len(h):  # k = 0: nothing is abandoned; reflect on the most suspect step so far
        r = min(suspect_step(ctx), len(h) - 1)
    knowledge = tuple(
        dict.fromkeys(f"'{s.action}' does nothing useful" for s in h[r:] if ERROR_OBSERVATION.search(s.observation))
    )
    gains = [s for i, s in enumerate(h[r:], start=r) if s.score > (h[i - 1].score if i > 0 else 0)]
    milestones = tuple(f"score {s.score:g} after '{s.action}'" for s in gains[-3:])
    failure = failure_record(h, r)
    return Reflection(knowledge[:3], milestones, failure)


def segments_containing(ctx: DecisionContext, step: int) -> int:
    for i, (a, b) in enumerate(ctx.segments):
        if a <= step < b:
            return i
    return len(ctx.segments) - 1


def latest_admissible_in(ctx: DecisionContext) -> int:
    a, b = ctx.segment or (0, len(ctx.history) + 1)
    inside = [i for i in ctx.admissible if a <= i < b]
    return max(inside) if inside else max(ctx.admissible, default=0)


def default_value(kind: DecisionKind, ctx: DecisionContext) -> object:
    """The safe default when a model's reply cannot be parsed."""
    if kind == "review":
        return Review("continue", "default after unparseable reply")
    if kind == "locate_coarse":
        return max(len(ctx.segments) - 1, 0)
    if kind == "locate_fine":
        return latest_admissible_in(ctx)
    return Reflection()


def rule_review(signal: FailureSignal | None, trigger: str) -> Review:
    """The heuristic's When: recover on a visible failure signal (a scheduled review waits for an
    urgent one), else continue."""
    if signal and (trigger != "schedule" or signal.urgent):
        return Review("recover", signal.text)
    return Review("continue", signal.text if signal else "no failure signal")
