"""Checkpoint store, admissible set and replay verification on the built-in environment."""

from __future__ import annotations

import pytest

from rir_runtime.envs import StepResult, TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.envs.checkpoints import CheckpointStore, Step
from rir_runtime.errors import RestoreError


def run_branch(env: WorkshopEnv, store: CheckpointStore, actions: list[str]) -> tuple[Step, ...]:
    history: tuple[Step, ...] = store[len(store) - 1].history if len(store) else ()
    for action in actions:
        result = env.step(action)
        step = Step(len(history), action, result.observation, result.score, result.won, result.lost)
        store.record_step(step, result)
        history = history + (step,)
        store.save(env, history)
    return history


@pytest.fixture
def branch(workshop: WorkshopEnv, task3: TaskSpec) -> tuple[WorkshopEnv, CheckpointStore, list[str]]:
    workshop.reset(task3)
    store = CheckpointStore()
    store.save(workshop, ())
    plan = workshop.expert_actions()
    run_branch(workshop, store, plan[:6])
    return workshop, store, plan


def test_checkpoint_holds_state_and_branch_history(branch) -> None:
    env, store, plan = branch
    assert len(store) == 7 and store.admissible() == list(range(7))
    c3 = store[3]
    assert [s.action for s in c3.history] == plan[:3]
    assert c3.snapshot.actions == tuple(plan[:3])


def test_restore_returns_env_and_history_and_drops_suffix(branch) -> None:
    env, store, plan = branch
    original = store.latest.history
    checkpoint, obs = store.restore(env, 2)
    assert obs.text == checkpoint.observation == checkpoint.history[-1].observation
    assert len(store) == 3 and store.admissible() == [0, 1, 2]
    # the restored engine behaves exactly like the original branch did from there
    history = run_branch(env, store, plan[2:6])
    assert history == original


def test_restore_rejects_missing_and_inadmissible_checkpoints(branch) -> None:
    env, store, _ = branch
    with pytest.raises(RestoreError, match="does not exist"):
        store.restore(env, 42)
    store.record_step(
        Step(3, "x", "", 0.0), StepResult("", 0, 0, False, False, False, {"irreversible_side_effect": True})
    )
    assert store.admissible() == [4, 5, 6]
    with pytest.raises(RestoreError, match="irreversible side effect"):
        store.restore(env, 2)


class FlakyWorkshop(WorkshopEnv):
    """Replays diverge: the observation after reset carries a counter (a nondeterministic engine)."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def _reset_engine(self, task):
        self.resets += 1
        return super()._reset_engine(task)

    def _step_engine(self, action):
        result = super()._step_engine(action)
        return StepResult(
            f"{result.observation} (tick {self.resets})",
            result.reward,
            result.score,
            result.done,
            result.won,
            result.lost,
            result.info,
        )


def test_diverging_replay_raises_and_marks_checkpoint_not_admissible(task3: TaskSpec) -> None:
    env = FlakyWorkshop()
    env.reset(task3)
    store = CheckpointStore()
    store.save(env, ())
    run_branch(env, store, env.expert_actions()[:4])
    with pytest.raises(RestoreError, match="diverged"):
        store.restore(env, 3)
    assert env.replay_divergences == 1 + env.replay_retries
    assert store.divergences == 1 and 3 not in store.admissible()
    # checkpoint 0 has no actions to replay, so it still restores
    checkpoint, _ = store.restore(env, 0)
    assert checkpoint.index == 0


def test_replay_verification_catches_a_changed_world(workshop: WorkshopEnv, task3: TaskSpec) -> None:
    workshop.reset(task3)
    for action in workshop.expert_actions()[:3]:
        workshop.step(action)
    snap = workshop.checkpoint()
    tampered = type(snap)(snap.task, snap.actions, snap.observation + " (edited)", snap.score, snap.kind)
    with pytest.raises(RestoreError):
        workshop.restore(tampered)
    assert workshop.restore(snap).text == snap.observation
