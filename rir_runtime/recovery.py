"""The unified recovery operator `Recover(k, M+)`, its presets, and the review schedule.

Every known method is a restricted case of one operator: roll back `k` steps (0 = stay,
t = restart, or the depth chosen by Where) and keep memory `M+` (nothing, a free-text
reflection, or the structured memory). The presets below are data; there is one loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Literal

from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UnknownNameError
from rir_runtime.guidance import Guidance, GuidanceMode
from rir_runtime.memory import MemoryMode

Depth = Literal["stay", "restart", "located"]
Localisation = Literal["coarse-fine", "coarse", "fine"]


@dataclass(frozen=True)
class RecoveryPreset:
    """One point in the recovery space: whether to recover, how deep, and what memory survives."""

    name: str
    recovers: bool
    depth: Depth
    memory: MemoryMode
    scheduled_review: bool = True  # False: reviews only when the agent calls `rollback` (and at the end)
    localisation: Localisation = "coarse-fine"
    keep_failures: bool = True
    keep_state_claims: bool = False
    # How the structured memory's failure records act on the agent's choice (guidance.py), and
    # whether a restore records the abandoned branch's action at the restore point for it.
    memory_guidance: GuidanceMode = "off"
    guidance_penalty: float = 5.0
    remember_abandoned: bool = False

    @property
    def guidance(self) -> Guidance:
        return Guidance(self.memory_guidance, self.guidance_penalty)


_RIR = RecoveryPreset(
    "rir", recovers=True, depth="located", memory="structured", memory_guidance="soft", remember_abandoned=True
)

PRESETS: dict[str, RecoveryPreset] = {
    "react": RecoveryPreset("react", recovers=False, depth="stay", memory="none"),
    "self-refine": RecoveryPreset("self-refine", recovers=True, depth="stay", memory="text"),
    "reflexion": RecoveryPreset("reflexion", recovers=True, depth="restart", memory="text"),
    "rollback-only": RecoveryPreset("rollback-only", recovers=True, depth="located", memory="none"),
    "rir": _RIR,
    # ablations of the full method (paper-style table)
    "rir-agent-review-only": replace(_RIR, name="rir-agent-review-only", scheduled_review=False),
    "rir-coarse-only": replace(_RIR, name="rir-coarse-only", localisation="coarse"),
    "rir-fine-only": replace(_RIR, name="rir-fine-only", localisation="fine"),
    "rir-no-failure-analysis": replace(_RIR, name="rir-no-failure-analysis", keep_failures=False),
    "rir-keeps-state-claims": replace(_RIR, name="rir-keeps-state-claims", keep_state_claims=True),
    # memory guidance: the paper's method reads its memory only in the prompt (off), hard excludes
    "rir-unguided": replace(_RIR, name="rir-unguided", memory_guidance="off", remember_abandoned=False),
    "rir-hard": replace(_RIR, name="rir-hard", memory_guidance="hard"),
    "rir-no-abandoned-record": replace(_RIR, name="rir-no-abandoned-record", remember_abandoned=False),
}
METHODS = ("react", "self-refine", "reflexion", "rollback-only", "rir")


def get_preset(name: str) -> RecoveryPreset:
    if name not in PRESETS:
        raise UnknownNameError("method", name, list(PRESETS))
    return PRESETS[name]


@dataclass
class ReviewSchedule:
    """Hybrid Adaptive Review's schedule: the interval halves after a failure signal and doubles
    after each "continue" verdict (bounded), and resets after a recovery."""

    base: int = 4
    minimum: int = 1
    maximum: int = 16
    interval: int = 0
    next_due: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.base <= self.maximum:
            raise ValueError("review intervals must satisfy 1 <= minimum <= base <= maximum")
        self.interval = self.base
        self.next_due = self.base

    def due(self, t: int) -> bool:
        return t >= self.next_due

    def on_signal(self, t: int) -> None:
        self.interval = max(self.minimum, self.interval // 2)
        self.next_due = min(self.next_due, t + self.interval)

    def on_verdict(self, t: int, recovered: bool) -> None:
        self.interval = self.base if recovered else min(self.maximum, self.interval * 2)
        self.next_due = t + self.interval


def segments(history: tuple[Step, ...], last_checkpoint: int, chunk: int = 6) -> tuple[tuple[int, int], ...]:
    """Coarse segments over checkpoints 0..last_checkpoint: cut after each milestone (a score
    increase), and cut long stretches into chunks, so the coarse choice stays small."""
    cuts = [0]
    previous = 0.0
    for step in history:
        if step.score > previous and step.index + 1 <= last_checkpoint:
            cuts.append(step.index + 1)
        previous = step.score
    cuts.append(last_checkpoint + 1)
    out: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(cuts):
        while b - a > chunk:
            out.append((a, a + chunk))
            a += chunk
        if b > a:
            out.append((a, b))
    return tuple(out)
