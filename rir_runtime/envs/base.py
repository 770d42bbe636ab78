"""The environment contract: reset, step, checkpoint, restore, admissible and expert actions.

Every benchmark (ScienceWorld, TextWorld cooking, the built-in workshop) implements `Env`.
Restoring has two flavours: engines with native snapshots put their state object in
`Snapshot.payload`; the rest restore by replay (`ReplayEnv`): reset with the same task and
re-execute the action prefix, then verify the replayed observation equals the recorded one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from rir_runtime.errors import RestoreError, UnknownNameError

Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")


def as_split(name: str) -> Split:
    """`name` as a `Split` (configs and flags carry plain strings), or the error that lists the splits."""
    for split in SPLITS:
        if name == split:
            return split
    raise UnknownNameError("split", name, list(SPLITS))


@dataclass(frozen=True)
class TaskSpec:
    """One concrete episode: a task of an environment, in a split, at a variation index.

    `variation` is an index *within the split* (ScienceWorld variation index among that split's
    variations; TextWorld game seed within the split's seed range; built-in seed within its range).
    """

    env: str
    task: str
    split: Split
    variation: int

    @property
    def key(self) -> str:
        return f"{self.env}/{self.task}/{self.split}/{self.variation}"


@dataclass(frozen=True)
class Observation:
    """What the agent sees after `reset`: the task objective and the first observation."""

    text: str
    objective: str
    score: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """The outcome of one action.

    `score` is the benchmark's running score (ScienceWorld 0..100, negative on fatal failure;
    TextWorld points). `won` is task completion, `lost` an unrecoverable failure inside the branch.
    `info["irreversible_side_effect"] = True` declares an external side effect that no restore can
    undo; checkpoints from before it become inadmissible. `info["changes"]`, a tuple of `RowChange`,
    lists the rows a database env's step changed; the loop keeps them on the step event.
    """

    observation: str
    reward: float
    score: float
    done: bool
    won: bool
    lost: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ColumnChange:
    """One column of a changed row, as text; None for the side an insert or a delete does not have."""

    column: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class RowChange:
    """One row a step changed in a database env, kept in the trace so that a reader sees what a write did
    without replaying it. `op` is insert, update or delete; `key` names the row ("line_id=102"; "" for a
    row without a stable key, such as a ledger row); `columns` holds every column of an inserted or deleted
    row and the changed columns of an updated one."""

    table: str
    key: str
    op: str
    columns: tuple[ColumnChange, ...]

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "key": self.key, "op": self.op, "columns": [vars(c) for c in self.columns]}

    @classmethod
    def from_json(cls, data: Any) -> RowChange:
        """The change from its JSON object; ValueError names what is malformed (the trace reader wraps it)."""
        ok = (
            isinstance(data, dict)
            and set(data) == {"table", "key", "op", "columns"}
            and isinstance(data["table"], str)
            and isinstance(data["key"], str)
            and data["op"] in ("insert", "update", "delete")
            and isinstance(data["columns"], list)
        )
        if not ok:
            raise ValueError(f"a row change is {{table, key, op (insert, update or delete), columns}}, got {data!r}")
        return cls(data["table"], data["key"], data["op"], tuple(_column(c) for c in data["columns"]))


def _column(data: Any) -> ColumnChange:
    """One `ColumnChange` read back from JSON: the column's name, and its values as text or null."""
    ok = (
        isinstance(data, dict)
        and set(data) == {"column", "before", "after"}
        and isinstance(data["column"], str)
        and all(data[side] is None or isinstance(data[side], str) for side in ("before", "after"))
    )
    if not ok:
        raise ValueError(f"a column change is {{column, before, after}} as text, got {data!r}")
    return ColumnChange(data["column"], data["before"], data["after"])


@dataclass(frozen=True)
class Snapshot:
    """Enough to bring an environment back to one moment.

    `actions` is the action prefix since reset (always kept: replay needs it, and it documents the
    branch). `payload` holds an engine-native state where the engine has one.
    """

    task: TaskSpec
    actions: tuple[str, ...]
    observation: str
    score: float
    kind: Literal["native", "replay"]
    payload: Any = None


class Env(ABC):
    """Base class of every environment. Subclasses own one running engine instance."""

    name: str = "env"
    #: whether `expert_actions()` is meaningful for this environment
    has_expert: bool = True
    #: whether the expert plans again from any state (False: it only knows one gold path, so any
    #: deviation reads as fatal to hindsight values, which are then only a lower bound)
    expert_replans: bool = True

    # --- task catalogue -------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def task_names(cls) -> list[str]:
        """All task names this environment accepts."""

    @abstractmethod
    def num_variations(self, task: str, split: Split) -> int:
        """How many variations `task` has in `split` (variation indices are 0..n-1)."""

    # --- episode --------------------------------------------------------------------------
    @abstractmethod
    def reset(self, task: TaskSpec) -> Observation:
        """Start `task` from its initial state."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Execute one action (any text; unknown actions produce an error observation)."""

    @abstractmethod
    def checkpoint(self) -> Snapshot:
        """Capture the current state."""

    @abstractmethod
    def restore(self, snapshot: Snapshot) -> Observation:
        """Return to `snapshot`; raise `RestoreError` when that cannot be done faithfully."""

    @abstractmethod
    def admissible_actions(self) -> list[str]:
        """Valid actions in the current state (sorted, deterministic)."""

    def expert_actions(self) -> list[str]:
        """The oracle plan from the current state to success ([] when none is known or possible)."""
        return []

    def max_score(self) -> float | None:
        """The current task's highest score (None when the benchmark does not say): a visible score
        below it at the end of an episode is a failure the agent can see."""
        return None

    def spawn(self) -> Env | None:
        """A fresh engine of this environment with the same settings, for a branch played beside this
        one (`rir_runtime/lockstep.py`); None where a second engine costs too much to start (the branches
        then play one after another on this one)."""
        return None

    def siblings(self, n: int) -> list[Env]:
        """This environment and up to n - 1 others of its kind, spawned once and kept for later branches."""
        spares: list[Env] = self.__dict__.setdefault("_siblings", [])
        while len(spares) < n - 1 and (twin := self.spawn()) is not None:
            spares.append(twin)
        return [self, *spares[: max(n - 1, 0)]]

    def close(self) -> None:  # noqa: B027 - an optional hook: most engines hold nothing to release
        """Release engine resources."""

    def engine_died(self, err: BaseException) -> bool:
        """Whether `err` came from the engine's own process dying (a JVM killed by a shared machine's
        memory pressure, say), which a fresh engine cures, rather than from the episode."""
        return False

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplayEnv(Env):
    """An `Env` that restores by replaying the action prefix and verifying the result.

    Subclasses implement `_reset_engine(task)` and `_step_engine(action)`; this class records the
    prefix and does checkpoint/restore. A replay whose final observation differs from the recorded
    one is retried `replay_retries` times, then raises `RestoreError` (never continues diverged).
    """

    replay_retries: int = 2

    def __init__(self) -> None:
        self._task: TaskSpec | None = None
        self._actions: list[str] = []
        self._last_observation: str = ""
        self._score: float = 0.0
        self.replay_divergences = 0

    @abstractmethod
    def _reset_engine(self, task: TaskSpec) -> Observation: ...

    @abstractmethod
    def _step_engine(self, action: str) -> StepResult: ...

    def reset(self, task: TaskSpec) -> Observation:
        obs = self._reset_engine(task)
        self._task, self._actions = task, []
        self._last_observation, self._score = obs.text, obs.score
        return obs

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        result = self._step_engine(action)
        self._actions.append(action)
        self._last_observation, self._score = result.observation, result.score
        return result

    def checkpoint(self) -> Snapshot:
        if self._task is None:
            raise RuntimeError("checkpoint() called before reset()")
        return Snapshot(
            task=self._task,
            actions=tuple(self._actions),
            observation=self._last_observation,
            score=self._score,
            kind="replay",
        )

    def restore(self, snapshot: Snapshot) -> Observation:
        for _attempt in range(1 + self.replay_retries):
            obs = self._reset_engine(snapshot.task)
            text, score = obs.text, obs.score
            for action in snapshot.actions:
                result = self._step_engine(action)
                text, score = result.observation, result.score
            if text == snapshot.observation and score == snapshot.score:
                self._task, self._actions = snapshot.task, list(snapshot.actions)
                self._last_observation, self._score = text, score
                return Observation(text=text, objective=obs.objective, score=score)
            self.replay_divergences += 1
        raise RestoreError(
            f"replay of {len(snapshot.actions)} actions on {snapshot.task.key} diverged from the "
            f"recorded observation {1 + self.replay_retries} times; the checkpoint is not admissible"
        )
