"""The checkpoint store: `C_i = (snapshot s_i, branch history h_i)` before every executable action.

The store also owns the admissible set `I_t`: a checkpoint is not admissible when its replay
diverged (the engine cannot faithfully return there), or when it lies behind an irreversible
external side effect the environment declared (restoring would pretend the effect never
happened). Restoring truncates the branch: checkpoints after the restore point belonged to the
abandoned suffix and are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from rir_runtime.envs.base import Env, Observation, Snapshot, StepResult
from rir_runtime.errors import RestoreError


@dataclass(frozen=True)
class Step:
    """One executed action of the current branch and what it produced."""

    index: int
    action: str
    observation: str
    score: float
    won: bool = False
    lost: bool = False
    injected_error: bool = False  # set by the error-injected expert: ground truth for evaluation


@dataclass(frozen=True)
class Checkpoint:
    """`C_i`: the state before action `index`, and the branch history that led there."""

    index: int
    snapshot: Snapshot
    history: tuple[Step, ...]

    @property
    def observation(self) -> str:
        return self.snapshot.observation

    @property
    def score(self) -> float:
        return self.snapshot.score


class CheckpointStore:
    """Checkpoints of the current branch, indexed by step number (0 = initial state)."""

    def __init__(self) -> None:
        self._checkpoints: list[Checkpoint] = []
        self._not_admissible: dict[int, str] = {}
        self._barrier = -1  # checkpoints with index <= barrier lie behind a side effect
        self.divergences = 0
        self.restores = 0

    def __len__(self) -> int:
        return len(self._checkpoints)

    def fork(self) -> CheckpointStore:
        """A copy whose branch can grow and be cut apart from this one's (the checkpoints are shared)."""
        twin = CheckpointStore()
        twin._checkpoints, twin._not_admissible = list(self._checkpoints), dict(self._not_admissible)
        twin._barrier, twin.divergences, twin.restores = self._barrier, self.divergences, self.restores
        return twin

    def __getitem__(self, index: int) -> Checkpoint:
        return self._checkpoints[index]

    @property
    def latest(self) -> Checkpoint:
        return self._checkpoints[-1]

    def save(self, env: Env, history: tuple[Step, ...]) -> Checkpoint:
        """Store the checkpoint before the next action (its index is the branch length)."""
        index = len(history)
        if index != len(self._checkpoints):
            raise RuntimeError(f"checkpoint {index} saved out of order (store has {len(self._checkpoints)})")
        checkpoint = Checkpoint(index=index, snapshot=env.checkpoint(), history=history)
        self._checkpoints.append(checkpoint)
        return checkpoint

    def record_step(self, step: Step, result: StepResult) -> None:
        """Note what a step did to admissibility (a declared irreversible side effect)."""
        if result.info.get("irreversible_side_effect"):
            self._barrier = max(self._barrier, step.index)

    def reason_not_admissible(self, index: int) -> str | None:
        """Why checkpoint `index` cannot be restored, or None when it can."""
        if not 0 <= index < len(self._checkpoints):
            return f"checkpoint {index} does not exist (the branch has checkpoints 0-{len(self._checkpoints) - 1})"
        if index <= self._barrier:
            return f"checkpoint {index} lies before an irreversible side effect at step {self._barrier}"
        return self._not_admissible.get(index)

    def admissible(self) -> list[int]:
        """`I_t`: indices of checkpoints that may be restored, oldest first."""
        return [c.index for c in self._checkpoints if self.reason_not_admissible(c.index) is None]

    def restore(self, env: Env, index: int) -> tuple[Checkpoint, Observation]:
        """Bring `env` back to checkpoint `index` and drop the abandoned suffix.

        Raises `RestoreError` for a non-admissible index, and marks a checkpoint whose replay
        diverged as not admissible (so it is never offered again) before re-raising.
        """
        reason = self.reason_not_admissible(index)
        if reason is not None:
            raise RestoreError(reason)
        checkpoint = self._checkpoints[index]
        try:
            observation = env.restore(checkpoint.snapshot)
        except RestoreError as err:
            self.divergences += 1
            self._not_admissible[index] = f"checkpoint {index} is not admissible: {err}"
            raise
        del self._checkpoints[index + 1 :]
        self.restores += 1
        return checkpoint, observation
