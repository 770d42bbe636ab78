"""The contract checker passes good environments and names the bug in broken ones."""

from __future__ import annotations

import random

from rir_runtime.envs import StepResult, TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.envs.checker import check_env


def failures(env, task) -> dict[str, str]:
    return {r.name: r.message for r in check_env(env, task) if not r.passed}


def test_builtin_passes_every_check(task3: TaskSpec) -> None:
    for task in WorkshopEnv.task_names():
        assert failures(WorkshopEnv(), TaskSpec("builtin", task, "dev", 1)) == {}


class RandomResetEnv(WorkshopEnv):
    def _reset_engine(self, task):
        obs = super()._reset_engine(task)
        return type(obs)(obs.text + f" A clock shows {random.random():.6f}.", obs.objective, obs.score)


class ForgetfulSnapshotEnv(WorkshopEnv):
    """Snapshots lose the inventory: a classic partial-state bug of hand-written snapshots."""

    def restore(self, snapshot):
        obs = super().restore(snapshot)
        for item in self._state.ingredients.values():
            item.held = False
        return obs


class BadTypesEnv(WorkshopEnv):
    def _step_engine(self, action):
        r = super()._step_engine(action)
        return StepResult(r.observation, r.reward, r.score, 1, r.won, r.lost)  # type: ignore[arg-type]


def test_nondeterministic_reset_is_named(task3: TaskSpec) -> None:
    found = failures(RandomResetEnv(), task3)
    assert "reset-determinism" in found and "seeded from something other than the task" in found["reset-determinism"]


def test_partial_snapshot_is_caught_by_rollback_check(task3: TaskSpec) -> None:
    found = failures(ForgetfulSnapshotEnv(), TaskSpec("builtin", "workshop-3", "dev", 0))
    assert "rollback" in found and "snapshot misses part of the state" in found["rollback"]


def test_wrong_step_types_are_named(task3: TaskSpec) -> None:
    found = failures(BadTypesEnv(), task3)
    assert found.get("step-types") == "StepResult.done must be bool"
