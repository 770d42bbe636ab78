"""Prompt rendering for the agent and for the three controller decisions.

This is the single renderer: prompted and tuned controllers call it at inference, and data_gen
calls it to build training examples, so training and inference see the same text. Bump
`PROMPT_FORMAT_VERSION` whenever a controller prompt changes and `AGENT_PROMPT_FORMAT_VERSION`
whenever the agent's does; tuned adapters record the version of their kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from rir_runtime.decisions import DecisionKind
from rir_runtime.envs.checkpoints import Step
from rir_runtime.signals import is_error_reply, trajectory_signals
from rir_runtime.values import Hindsight

# 2: a terminal review states the ending; 3: compact trajectory lines and a Signals line
PROMPT_FORMAT_VERSION = 3
# The agent's prompt (render_agent) counts apart: unchanged since it shared version 2 with the
# controllers, so agent adapters trained then still load.
AGENT_PROMPT_FORMAT_VERSION = 2
# The value controller's trajectory prompt and option texts (`controllers/options.py`), a family of their own.
VALUE_PROMPT_VERSION = 1
PROMPT_VERSIONS = {"agent": AGENT_PROMPT_FORMAT_VERSION, "value": VALUE_PROMPT_VERSION}


def prompt_format_version(kind: str) -> int:
    """The prompt format an adapter of this kind ("agent", "value" or "controller") is trained on."""
    return PROMPT_VERSIONS.get(kind, PROMPT_FORMAT_VERSION)


Messages = list[dict[str, str]]


@dataclass(frozen=True)
class DecisionContext:
    """Everything a controller may look at when deciding; the same for every implementation."""

    task: str
    objective: str
    memory: str
    history: tuple[Step, ...]
    observation: str
    score: float
    trigger: str = "schedule"
    admissible: tuple[int, ...] = ()
    segments: tuple[tuple[int, int], ...] = ()  # coarse: [start, end) checkpoint ranges
    segment: tuple[int, int] | None = None  # fine: the chosen range
    restore_point: int | None = None  # reflect: where the branch is being rolled back to
    blamed_actions: tuple[str, ...] = ()  # actions already named in remembered failures
    max_score: float | None = None  # the task's highest score, where the benchmark says
    extra: dict[str, object] = field(default_factory=dict)
    # The oracle's view of the future: set by the loop only for controllers that ask for it.
    hindsight: Hindsight | None = field(default=None, compare=False, repr=False)
    # The model calls this decision may spend (its budget's remainder); None: unbounded. A retry
    # after an unparseable reply is skipped when it would overspend.
    calls_left: int | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> str:
        """Serialised form kept next to each training row, so any controller can be scored offline
        on exactly the situation the row was built from (hindsight and budgets are never serialised)."""
        data = asdict(replace(self, hindsight=None))
        del data["hindsight"], data["calls_left"]
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> DecisionContext:
        data = json.loads(text)
        data["history"] = tuple(Step(**s) for s in data["history"])
        for key in ("admissible", "blamed_actions"):
            data[key] = tuple(data[key])
        data["segments"] = tuple(tuple(s) for s in data["segments"])
        data["segment"] = tuple(data["segment"]) if data["segment"] else None
        return cls(**data)


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def history_lines(history: tuple[Step, ...], max_steps: int = 30, keep_first: int = 2) -> list[str]:
    """One line per step; long trajectories are cut from the middle (keep the start and the end)."""
    lines = [f"[{s.index}] {s.action} -> {_clip(s.observation)} (score {s.score:g})" for s in history]
    return _cut_middle(lines, max_steps, keep_first)


def compact_lines(
    history: tuple[Step, ...], max_steps: int = 30, keep_first: int = 2, keep_replies: int = 2
) -> list[str]:
    """One line per step for the controller: the action, and the reply only where it carries a signal
    (an error reply, a score change, the end) or is one of the last `keep_replies`; the score only
    where it changed. Most replies repeat the room; these lines cost a fraction of the tokens."""
    lines = []
    for i, s in enumerate(history):
        before = history[i - 1].score if i else 0.0
        changed = s.score != before
        telling = changed or s.won or s.lost or is_error_reply(s.observation) or i >= len(history) - keep_replies
        line = f"[{s.index}] {s.action}"
        if telling:
            line += f" -> {_clip(s.observation, 120)}"
        if changed:
            line += f" (score {s.score:g})"
        if s.lost:
            line += " LOST"
        lines.append(line)
    return _cut_middle(lines, max_steps, keep_first)


def _cut_middle(lines: list[str], max_steps: int, keep_first: int) -> list[str]:
    if len(lines) > max_steps:
        cut = len(lines) - max_steps
        lines = lines[:keep_first] + [f"... ({cut} steps omitted) ..."] + lines[keep_first + cut :]
    return lines


SYSTEM_CONTROLLER = (
    "You are the recovery controller of a text-game agent. The environment can be rolled back to "
    "checkpoints; checkpoint i is the state just before step i. Reply with one JSON object only."
)

INSTRUCTIONS: dict[DecisionKind, str] = {
    "review": 'Should the agent continue this branch or recover (roll back)? Answer {"decision": '
    '"continue" or "recover", "reason": "<short reason>"}.',
    "locate_coarse": 'Which segment contains the step that caused the trouble? Answer {"segment": <segment number>}.',
    "locate_fine": "Restore to which checkpoint? Pick the checkpoint just before the harmful step. Answer "
    '{"step": <checkpoint number>}.',
    "reflect": "The branch after the restore point is abandoned. Write what should be remembered; never describe "
    'the current state. Answer {"env_knowledge": [<reusable facts>], "milestones": [<progress reached>], '
    '"failure": {"condition": "<situation>", "action": "<harmful action>", "outcome": "<what happened>", '
    '"lesson": "<what to do instead in that situation>"}}.',
}


def render_decision(kind: DecisionKind, ctx: DecisionContext, max_steps: int = 30) -> Messages:
    """The chat messages asking for one decision; the decision type is named in the prompt so one
    adapter can learn all three. The trajectory is compact (`compact_lines`) and the signals a
    decision rests on are stated up front (`signals.trajectory_signals`)."""
    parts = [f"Decision: {kind}", f"Task: {_clip(ctx.objective, 300)}"]
    if ctx.memory:
        parts.append(f"Memory:\n{ctx.memory}")
    signals = trajectory_signals(ctx.history)
    if signals:
        parts.append("Signals: " + "; ".join(signals))
    parts.append("Trajectory:\n" + ("\n".join(compact_lines(ctx.history, max_steps)) or "(no steps yet)"))
    same = bool(ctx.history) and ctx.observation == ctx.history[-1].observation  # shown in the last line
    parts.append(f"Now: {'as after the last step' if same else _clip(ctx.observation, 200)} (score {ctx.score:g})")
    if kind == "review":
        parts.append(f"Review trigger: {ctx.trigger}")
        if ctx.trigger == "terminal":
            parts.append(f"Outcome: {ending(ctx)}")
    elif kind == "locate_coarse":
        segs = [f"segment {i}: checkpoints {a}-{b - 1}" for i, (a, b) in enumerate(ctx.segments)]
        parts.append("Segments:\n" + "\n".join(segs))
    elif kind == "locate_fine":
        a, b = ctx.segment or (0, 0)
        choices = [i for i in ctx.admissible if a <= i < b]
        parts.append(f"Admissible checkpoints in this segment: {choices}")
    elif kind == "reflect":
        parts.append(f"Restoring to checkpoint {ctx.restore_point}; steps from there on are abandoned.")
    parts.append(INSTRUCTIONS[kind])
    return [{"role": "system", "content": SYSTEM_CONTROLLER}, {"role": "user", "content": "\n\n".join(parts)}]


def ending(ctx: DecisionContext) -> str:
    """How a terminal review's episode ended, in the words the agent could see: a terminal review
    happens only when an episode ends without success."""
    of = f" of {ctx.max_score:g}" if ctx.max_score is not None else ""
    return f"the episode ended without success, at score {ctx.score:g}{of}"


def content_tokens(messages: Messages) -> int:
    """A tokenizer-free estimate of the messages' text (about 4 characters per token for English):
    the prompt tokens reported for a scoring pass, which returns no usage."""
    return sum(len(m["content"]) for m in messages) // 4


def approx_tokens(messages: Messages) -> int:
    """`content_tokens` plus a chat template's overhead per message, for fitting a prompt."""
    return content_tokens(messages) + 8 * len(messages)


def fit_decision(
    kind: DecisionKind, ctx: DecisionContext, max_tokens: int = 2048, count: Callable[[Messages], int] = approx_tokens
) -> Messages:
    """`render_decision` with the trajectory cut from the middle until the prompt fits
    `max_tokens`; the objective, memory and latest steps are always kept."""
    for max_steps in (30, 20, 14, 10, 6, 4, 2):
        messages = render_decision(kind, ctx, max_steps)
        if count(messages) <= max_tokens:
            return messages
    return messages


SYSTEM_AGENT = (
    "You are an agent in a text game. Each turn, choose exactly one action from the list of valid "
    "actions and answer 'Action: <action>'. If you believe an earlier step ruined the task, you may "
    "answer 'Action: rollback <reason>' instead."
)


def render_agent(
    objective: str, memory: str, history: tuple[Step, ...], observation: str, actions: list[str], max_steps: int = 10
) -> Messages:
    """The LLM policy's prompt: objective, memory block, history (first steps and the latest ones),
    observation, valid actions."""
    recent = history_lines(history, max_steps=max_steps, keep_first=2)
    parts = [f"Task: {objective}"]
    if memory:
        parts.append(f"Lessons from earlier attempts:\n{memory}")
    if recent:
        parts.append("Recent steps:\n" + "\n".join(recent))
    parts.append(f"Observation: {_clip(observation, 400)}")
    parts.append("Valid actions: " + ", ".join(actions))
    parts.append("Answer with 'Action: <action>'.")
    return [{"role": "system", "content": SYSTEM_AGENT}, {"role": "user", "content": "\n\n".join(parts)}]
