"""`ShopDBEnv`: the shop behind the `Env` contract, with native snapshots.

A snapshot is `Connection.serialize()` (the whole in-memory database as bytes) plus the episode
state that lives outside the database: the successful writes and external calls in order (the
outbox is their external part), the reads made, and whether `finish` was called. Restoring
deserializes the bytes into the same connection. Replay (`ReplayEnv`) stays as the fallback for a
snapshot without a payload.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace
from typing import Any

from rir_runtime.envs.base import Observation, ReplayEnv, Snapshot, Split, StepResult, TaskSpec
from rir_runtime.envs.shopdb import schema
from rir_runtime.envs.shopdb.expert import admissible, pending, remaining_writes, with_reads
from rir_runtime.envs.shopdb.grading import changes, content_hash, read_rows, tally
from rir_runtime.envs.shopdb.reads import run_read
from rir_runtime.envs.shopdb.scenario import SPLIT_SEED_BASE, VARIATIONS_PER_SPLIT, Scenario, scenario
from rir_runtime.envs.shopdb.tasks import TASKS
from rir_runtime.envs.shopdb.tools import Call, parse, tool_list
from rir_runtime.envs.shopdb.writes import Refused, apply_write, check_external
from rir_runtime.errors import RestoreError, UnknownNameError, UserInputError

MAX_SCORE = 100.0
PROGRESS_SCORE = 80.0  # the running score tops out here; only a matching `finish` reaches MAX_SCORE
OVER = "The episode is over."


@dataclass(frozen=True)
class ShopState:
    """The episode state outside the database (immutable, so a snapshot can share it)."""

    made: tuple[str, ...] = ()  # successful writes and external calls, canonical, in order
    seen: frozenset[str] = frozenset()  # successful reads, canonical and casefolded
    over: bool = False

    @property
    def outbox(self) -> tuple[str, ...]:
        return tuple(m for m in self.made if m.startswith(("send_email ", "charge_card ")))


@dataclass(frozen=True)
class NativeState:
    db: bytes
    state: ShopState


class ShopDBEnv(ReplayEnv):
    """The shop environment (`shopdb`): tool calls on an in-memory SQLite database."""

    name = "shopdb"

    def __init__(self) -> None:
        super().__init__()
        self._conn: sqlite3.Connection = schema.connect()
        self._scenario: Scenario | None = None
        self._state = ShopState()
        self._plans: dict[tuple[str, tuple[str, ...]], list[tuple[int, str]] | None] = {}

    def spawn(self) -> ShopDBEnv:
        return ShopDBEnv()

    @classmethod
    def task_names(cls) -> list[str]:
        return list(TASKS)

    def num_variations(self, task: str, split: Split) -> int:
        if task not in TASKS:
            raise UnknownNameError("shopdb task", task, list(TASKS))
        return VARIATIONS_PER_SPLIT

    def max_score(self) -> float | None:
        return MAX_SCORE

    @property
    def outbox(self) -> tuple[str, ...]:
        """The external calls made in this branch (emails sent, cards charged), in order."""
        return self._state.outbox

    def db_hash(self) -> str:
        """The content hash of the current database (what grading compares with the gold one)."""
        return content_hash(self._conn)

    @property
    def scenario(self) -> Scenario:
        if self._scenario is None:
            raise RuntimeError("no task: call reset() first")
        return self._scenario

    # --- engine -----------------------------------------------------------------------
    def _reset_engine(self, task: TaskSpec) -> Observation:
        if task.task not in TASKS:
            raise UnknownNameError("shopdb task", task.task, list(TASKS))
        if not 0 <= task.variation < VARIATIONS_PER_SPLIT or task.split not in SPLIT_SEED_BASE:
            raise UserInputError(f"shopdb variations are 0-{VARIATIONS_PER_SPLIT - 1} per split; got {task}")
        if self._scenario is None or self._scenario.task != task:
            self._scenario, self._plans = scenario(task), {}
        self._conn.deserialize(self._scenario.init_db)
        self._state = ShopState()
        text = (
            "You are the shop's back-office agent, working on its SQLite database through tools. "
            "One tool call per action, e.g. `lookup_customer Maria Lopez` or `refund 1042 37.50`. Tools:\n"
            + tool_list()
        )
        return Observation(text=text, objective=self._scenario.objective, score=0.0)

    def _step_engine(self, action: str) -> StepResult:
        if self._state.over:
            return StepResult(OVER, reward=0.0, score=self._score, done=True, won=False, lost=False)
        call = parse(action)
        if not isinstance(call, Call):
            return self._result(call.message)
        if call.kind == "finish":
            return self._finish()
        if call.kind == "read":
            text = run_read(self._conn, call)
            self._state = replace(self._state, seen=self._state.seen | {call.canonical.casefold()})
            return self._result(text)
        before = read_rows(self._conn)
        try:
            if call.kind == "external":
                text = check_external(self._conn, call)
            else:
                text = apply_write(self._conn, call)
        except Refused as err:
            return self._result(str(err))
        self._state = replace(self._state, made=self._state.made + (call.canonical,))
        if call.kind == "external":  # the outbox, not the database: no row changes, and no restore may cross it
            return self._result(text, info={"irreversible_side_effect": True})
        return self._result(text, info={"changes": changes(before, read_rows(self._conn))})

    def _finish(self) -> StepResult:
        sc = self.scenario
        self._state = replace(self._state, over=True)
        won = self.db_hash() == sc.gold_hash and sorted(self.outbox) == sorted(sc.gold_outbox)
        if won:
            return self._result("finish: the task is complete; the database and the outbox match the policy.", won=True)
        share = tally(sc.init_rows, sc.gold_rows, read_rows(self._conn), sc.gold_outbox, self.outbox).share
        score = min(round(MAX_SCORE * share, 2), MAX_SCORE - 0.01)
        text = "finish: the task is not complete; the database or the outbox does not match the policy."
        return self._result(text, lost=True, score=score)

    def _result(
        self,
        text: str,
        won: bool = False,
        lost: bool = False,
        score: float | None = None,
        info: dict[str, Any] | None = None,
    ) -> StepResult:
        """The step's result; `info` carries an external call's irreversibility or a write's changed rows."""
        if score is None:
            score = MAX_SCORE if won else self._progress()
        return StepResult(
            observation=text,
            reward=score - self._score,
            score=score,
            done=won or lost,
            won=won,
            lost=lost,
            info=info or {},
        )

    def _progress(self) -> float:
        """Gold reads made, plus writes and calls made (right or wrong, capped at the gold count): the
        running score never tells a silent mistake from the right write."""
        sc = self.scenario
        reads = sum(r.casefold() in self._state.seen for r in sc.reads)
        points = reads + min(len(self._state.made), len(sc.ops))
        return round(PROGRESS_SCORE * points / max(1, len(sc.steps)), 2)

    # --- snapshots ----------------------------------------------------------------------
    def checkpoint(self) -> Snapshot:
        return replace(super().checkpoint(), kind="native", payload=NativeState(self._conn.serialize(), self._state))

    def restore(self, snapshot: Snapshot) -> Observation:
        payload = snapshot.payload
        if snapshot.kind != "native" or not isinstance(payload, NativeState):
            return super().restore(snapshot)  # replay and verify
        if self._scenario is None or self._scenario.task != snapshot.task:
            self._reset_engine(snapshot.task)
        try:
            self._conn.deserialize(payload.db)
        except sqlite3.Error as err:
            raise RestoreError(f"the snapshot's database cannot be loaded: {err}") from err
        self._state = payload.state
        self._task, self._actions = snapshot.task, list(snapshot.actions)
        self._last_observation, self._score = snapshot.observation, snapshot.score
        return Observation(text=snapshot.observation, objective=self.scenario.objective, score=snapshot.score)

    # --- actions ------------------------------------------------------------------------
    def _remaining(self) -> list[tuple[int, str]] | None:
        key = (self.scenario.task.key, self._state.made)  # the database is a function of the writes made
        if key not in self._plans:
            if len(self._plans) > 4096:
                self._plans.clear()
            self._plans[key] = remaining_writes(self.scenario, self._conn, self._state.made)
        return self._plans[key]

    def expert_actions(self) -> list[str]:
        """The plan from here to success; [] once success is out of reach (a wrong external call, a
        wrong write no tool can take back) or the episode is over."""
        if self._scenario is None or self._state.over:
            return []
        todo = self._remaining()
        return [] if todo is None else with_reads(self.scenario, todo, self._state.seen)

    def admissible_actions(self) -> list[str]:
        if self._scenario is None or self._state.over:
            return []
        plan = self.expert_actions() or pending(self.scenario, self._state.made, self._state.seen)
        return admissible(self.scenario, plan)

    def close(self) -> None:
        self._conn.close()
        self._conn, self._scenario = schema.connect(), None  # a later reset starts afresh
