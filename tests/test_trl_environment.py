"""The snapshot-and-branch environment served to TRL: rollouts restored at a decision point, stepped
by tool calls, rolled back on request, scored by the win."""

from __future__ import annotations

import inspect

import pytest

from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.errors import UserInputError
from rir_runtime.trl_environment import CheckpointEnvironment

TASK = {"env": "builtin", "task": "workshop-2", "split": "dev", "variation": 3}


def expert_path() -> list[str]:
    env = WorkshopEnv()
    env.reset(TaskSpec("builtin", "workshop-2", "dev", 3))
    return env.expert_actions()


def test_rollouts_start_at_the_decision_point_and_win_by_their_tool_calls() -> None:
    plan = expert_path()
    first, second = CheckpointEnvironment(), CheckpointEnvironment()
    start = first.reset(**TASK, actions=plan[:3])
    assert second.reset(**TASK, actions=plan[:3]) == start  # every rollout of a group: one state
    for action in plan[3:]:
        first.act(action)
    assert first.get_reward() == 1.0 and second.get_reward() == 0.0
    assert first.act("look") == "The episode is over."


def test_a_rollout_can_roll_back_to_any_of_its_checkpoints() -> None:
    plan = expert_path()
    env = CheckpointEnvironment()
    env.reset(**TASK, actions=[])
    seen = [env.act(a) for a in plan[:3]]
    assert env.rollback(1).startswith(seen[0].rsplit(" (score", 1)[0])
    assert len(env.history) == 1 and env.rollback(9).startswith("cannot roll back")


def test_the_tools_trl_shows_the_model_are_documented_and_a_row_without_task_is_refused() -> None:
    tools = [
        name for name, _ in inspect.getmembers(CheckpointEnvironment, inspect.isfunction) if not name.startswith("_")
    ]
    assert sorted(tools) == ["act", "get_reward", "reset", "rollback"]
    for name in ("act", "rollback"):
        doc = inspect.getdoc(getattr(CheckpointEnvironment, name)) or ""
        assert "Args:" in doc and "Returns:" in doc  # TRL builds the tool schema from these
    with pytest.raises(UserInputError, match="needs `task`"):
        CheckpointEnvironment().reset(env="builtin")
