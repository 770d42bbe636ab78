"""The value controller's view of a decision: the trajectory as one prompt, and the options of the
decision as short texts that name the step each one blames.

The options of a review are {continue} and {recover to checkpoint i with the lesson for step i} for
the admissible checkpoints; after a review that recovered (or a failed ending) only the recoveries
are left. An option names the action it undoes, not an index or a segment number: a small model can
match "go back to before 'heat flour'" against the recipe the trajectory read, and cannot match an
index. The lesson an option names is the record the rule writes for that restore point
(`reflection_for`), so the value learned for an option is the value of the recovery the runtime
then makes. Data building (`data_gen/value_rows.py`) and the value controller render with these
same functions; `VALUE_PROMPT_VERSION` (`prompts.py`) travels with every value adapter and is
checked when it loads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rir_runtime.controllers.rules import reflection_for
from rir_runtime.envs.checkpoints import Step
from rir_runtime.prompts import VALUE_PROMPT_VERSION, DecisionContext

__all__ = ["VALUE_PROMPT_VERSION", "Option", "option_text", "recovery_options", "value_prompt"]
READ_VERBS = ("read", "examine", "look")  # replies worth keeping in full: what the agent read
REPLY_CHARS = 240  # a kept reply is clipped to this
MAX_STEPS_SHOWN = 60  # longer branches keep their first steps and their latest ones
HEAD_STEPS = 4
CONTINUE = "Option: go on as before."


@dataclass(frozen=True)
class Option:
    """One option of a decision: `checkpoint` None goes on; i recovers to checkpoint i (i = the
    current checkpoint: stay, with the lesson)."""

    checkpoint: int | None
    text: str


def blamed_action(ctx: DecisionContext, checkpoint: int) -> str:
    """The action a recovery to `checkpoint` remembers as failed: the one taken there, or for a stay
    the step the rule suspects (`reflection_for`); empty where there is none."""
    failure = reflection_for(ctx, checkpoint).failure
    return failure.action if failure else ""


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def option_text(ctx: DecisionContext, checkpoint: int | None) -> str:
    """The option as the model reads it: the action it undoes (with its occurrence, where the branch
    took that action more than once) and the lesson it keeps."""
    if checkpoint is None:
        return CONTINUE
    history = ctx.history
    if checkpoint >= len(history):
        action = blamed_action(ctx, checkpoint)
        return f"Option: stay here and stop doing '{action}'." if action else "Option: stay here and think again."
    action = history[checkpoint].action
    seen = Counter(s.action for s in history)[action]
    nth = sum(s.action == action for s in history[: checkpoint + 1])
    which = f"the {_ordinal(nth)} '{action}'" if seen > 1 else f"'{action}'"
    return f"Option: go back to before {which} and never do it there again."


def recovery_options(ctx: DecisionContext, with_continue: bool) -> list[Option]:
    """The options of a decision, latest first: continue (at a review), then every admissible checkpoint."""
    restores = [Option(i, option_text(ctx, i)) for i in sorted(ctx.admissible, reverse=True)]
    return ([Option(None, CONTINUE)] if with_continue else []) + restores


def _clip(text: str, n: int = REPLY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _step_line(step: Step, previous_score: float, show_reply: bool) -> str:
    line = f"{step.index + 1}. {step.action}"
    if step.score != previous_score:
        line += f" (score {step.score:g})"
    if step.lost:
        line += " (lost)"
    return line + (f" -> {_clip(step.observation)}" if show_reply else "")


def _shown(history: tuple[Step, ...]) -> list[Step | None]:
    """The steps the prompt lists: all of a short branch; of a long one its first and latest, with None
    where the middle is left out."""
    if len(history) <= MAX_STEPS_SHOWN:
        return list(history)
    return [*history[:HEAD_STEPS], None, *history[-(MAX_STEPS_SHOWN - HEAD_STEPS) :]]


def value_prompt(ctx: DecisionContext) -> str:
    """The trajectory the options are valued against: the task, the lessons in memory, every action
    with its score changes, the replies of the first step, of steps that read something, and of the
    latest step. It ends where an option's text begins."""
    lines = [f"Task: {ctx.objective}", f"Lessons: {ctx.memory or 'none'}", "Trajectory:"]
    previous = 0.0
    last = len(ctx.history) - 1
    for step in _shown(ctx.history):
        if step is None:
            lines.append("...")
            continue
        reads = step.action.split(" ", 1)[0].lower() in READ_VERBS
        lines.append(_step_line(step, previous, step.index in (0, last) or reads))
        previous = step.score
    if not ctx.history:
        lines.append("(no action yet)")
    lines += [f"Now: {_clip(ctx.observation)}", "Which option leads to success?", ""]
    return "\n".join(lines)
