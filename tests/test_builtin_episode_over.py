"""Acting in a finished builtin episode (`rir play` lets a person type on after WON or LOST)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv, generate


def _trap_task() -> TaskSpec:
    tasks = (TaskSpec("builtin", "workshop-4", "train", v) for v in range(50))
    return next(t for t in tasks if any(i.volatile for i in generate(t).values()))


def _lose(env: WorkshopEnv) -> float:
    task = _trap_task()
    env.reset(task)
    item = next(i for i in generate(task).values() if i.volatile)
    for action in ["go to " + item.room, "take " + item.name]:
        env.step(action)
    result = env.step("heat " + item.name)
    assert result.lost and result.done
    return result.score


def _win(env: WorkshopEnv) -> float:
    env.reset(TaskSpec("builtin", "workshop-3", "dev", 0))
    for action in env.expert_actions():
        result = env.step(action)
    assert result.won and result.done
    return result.score


@pytest.mark.parametrize("finish", [_lose, _win], ids=["lost", "won"])
def test_a_step_after_the_end_is_a_no_op_that_says_so(
    workshop: WorkshopEnv, finish: Callable[[WorkshopEnv], float]
) -> None:
    final_score = finish(workshop)
    again = workshop.step("look")
    assert again.observation == "The episode is over."
    assert again.done and not again.won and not again.lost
    assert again.score == final_score and again.reward == 0.0
