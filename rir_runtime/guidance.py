"""Memory-guided action choice: failure records act on the agent's choice, not only on its prompt.

A 135M agent reads text lessons poorly: restored to a good state with a lesson in its memory, it
takes the very action the lesson warns against. RIR's memory holds structured failure records, so
the runtime can apply them directly. Where the current state matches a record, the recorded
action is penalised:

- a record matches **exactly** when it was made at this checkpoint of this branch (the same action
  prefix: `Anchored`, from a reflection's failure record or from a branch a restore abandoned);
- a failure record also matches **by condition** when most content words of its condition occur in
  what the agent sees now (`memory.condition_matches`): the heuristic What writes "after seeing:
  <the observation before the harmful step>", which recurs when the agent stands there again.

`soft` subtracts `penalty` from the action's log-probability (ranking, constrained decoding) and
rejects and redraws a generated reply once; `hard` excludes the action (a generated reply is
redrawn until it is not a warned action, then the first unwarned admissible action is taken).
Only the structured memory guides; free-text memories (self-refine, Reflexion) are read, not
enforced, as those methods define them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rir_runtime.envs.checkpoints import Step
from rir_runtime.memory import ReflectionMemory, condition_matches

GuidanceMode = Literal["off", "soft", "hard"]
GUIDANCE_MODES: tuple[GuidanceMode, ...] = ("off", "soft", "hard")
EXCLUDED = math.inf


@dataclass(frozen=True)
class Guidance:
    """How the memory's failure records act on the agent's choice (a recovery preset's setting)."""

    mode: GuidanceMode = "off"
    penalty: float = 5.0  # log-probability taken off a warned action under `soft`

    def __post_init__(self) -> None:
        if self.mode not in GUIDANCE_MODES:
            raise ValueError(f"memory_guidance must be one of {', '.join(GUIDANCE_MODES)}, not {self.mode!r}")
        if self.penalty < 0:
            raise ValueError("the guidance penalty is a log-probability to subtract: >= 0")

    def warnings(self, memory: ReflectionMemory, history: tuple[Step, ...], observation: str) -> dict[str, str]:
        """{action (lower case): why} for every action the memory warns against in this state."""
        if self.mode == "off" or memory.mode != "structured":
            return {}
        prefix = tuple(s.action for s in history)
        out = {
            a.action.strip().lower(): f"{a.source} at this checkpoint" for a in memory.anchored if a.prefix == prefix
        }
        for f in memory.failures:
            key = f.action.strip().lower()
            if key not in out and condition_matches(f.condition, observation):
                out[key] = "failure record whose condition matches what is seen now"
        return out

    def penalties(self, candidates: list[str], warned: dict[str, str]) -> dict[int, float]:
        """{candidate index: log-probability penalty} (`EXCLUDED` under `hard`); never every candidate
        excluded: when the memory warns against all of them, it cannot choose, and guidance stands aside."""
        hits = [i for i, c in enumerate(candidates) if _action_of(c) in warned]
        if not hits or len(hits) == len(candidates):
            return {}
        return {i: EXCLUDED if self.mode == "hard" else self.penalty for i in hits}


@dataclass(frozen=True)
class GuidedChoice:
    """What the memory changed at one step (recorded in the trace as a `guidance` event)."""

    mode: str
    warned: tuple[str, ...]  # the candidates the memory warned against
    reasons: tuple[str, ...]
    penalty: float  # subtracted from each warned candidate (inf: excluded)
    unguided: str  # what the agent would have done without guidance
    chosen: str
    scores: tuple[float, ...] = ()  # the warned candidates' log-probabilities before the penalty (ranking)

    @property
    def changed(self) -> bool:
        return self.unguided != self.chosen


def _action_of(candidate: str) -> str:
    """A candidate as the policy writes it ("Action: take knife") as the memory stores it."""
    return candidate.removeprefix("Action: ").strip().lower()
