"""The built-in workshop: deterministic, winnable by its expert, with traps and silent errors."""

from __future__ import annotations

import pytest

from rir_runtime.envs import TaskSpec, make_env, parse_variations, resolve_tasks
from rir_runtime.envs.builtin import TASKS, WorkshopEnv, generate
from rir_runtime.errors import UnknownNameError, UserInputError


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_expert_plan_wins(workshop: WorkshopEnv, task: str, split: str) -> None:
    for v in range(5):
        workshop.reset(TaskSpec("builtin", task, split, v))
        result = None
        for action in workshop.expert_actions():
            assert action in workshop.admissible_actions(), action
            result = workshop.step(action)
        assert result is not None and result.won and result.score == 100


def test_splits_generate_disjoint_workshops() -> None:
    layouts = {
        split: {
            repr(sorted((k, i.needed) for k, i in generate(TaskSpec("builtin", "workshop-3", split, v)).items()))
            for v in range(30)
        }
        for split in ("train", "dev", "test")
    }
    assert layouts["train"] != layouts["dev"] != layouts["test"]


def test_silent_error_shows_only_at_combine(workshop: WorkshopEnv, task3: TaskSpec) -> None:
    workshop.reset(task3)
    plan = workshop.expert_actions()
    first_process = next(i for i, a in enumerate(plan) if a.split()[0] in ("slice", "heat", "chill", "grind"))
    verb, item = plan[first_process].split(" ", 1)
    wrong = next(p for p in ("slice", "chill", "grind") if p != verb)  # never heat: may be a trap
    for action in plan[:first_process]:
        workshop.step(action)
    right_text = f"You {verb} the {item}."
    result = workshop.step(f"{wrong} {item}")
    assert result.observation == right_text.replace(verb, wrong) and not result.done  # no symptom yet
    assert workshop.ruined_ingredients() == [item]
    assert workshop.expert_actions() == []  # success is no longer possible
    # finish the rest of the recipe correctly: the symptom appears only at combine
    workshop.reset(task3)
    for action in plan[:first_process]:
        workshop.step(action)
    workshop.step(f"{wrong} {item}")
    for action in plan[first_process + 1 :]:
        result = workshop.step(action)
    assert result.lost and result.done and result.score < 0


def test_heating_a_volatile_ingredient_is_an_irreversible_trap(workshop: WorkshopEnv) -> None:
    for v in range(50):
        task = TaskSpec("builtin", "workshop-4", "train", v)
        volatile = [i for i in generate(task).values() if i.volatile]
        if volatile:
            break
    workshop.reset(task)
    item = volatile[0]
    for action in ["go to " + item.room, "take " + item.name]:
        workshop.step(action)
    result = workshop.step("heat " + item.name)
    assert result.lost and result.done and "flames" in result.observation
    assert workshop.admissible_actions() == []


def test_unknown_actions_answer_not_crash(workshop: WorkshopEnv, task3: TaskSpec) -> None:
    workshop.reset(task3)
    result = workshop.step("dance wildly")
    assert "Nothing happens" in result.observation and not result.done


def test_bad_selection_errors_are_clear() -> None:
    env = make_env("builtin")
    with pytest.raises(UnknownNameError, match="workshop-3"):
        resolve_tasks(env, ["workshop3"], "dev", [0])
    with pytest.raises(UnknownNameError, match="split"):
        resolve_tasks(env, ["workshop-3"], "validation", [0])
    with pytest.raises(UserInputError, match="variation 99999"):
        resolve_tasks(env, ["workshop-3"], "dev", [99999])
    with pytest.raises(UserInputError, match="task list is empty"):
        resolve_tasks(type("E", (WorkshopEnv,), {"task_names": classmethod(lambda c: [])})(), None, "dev", None)
    with pytest.raises(UnknownNameError, match="environment"):
        make_env("scienceword")


def test_parse_variations() -> None:
    assert parse_variations("0-3") == [0, 1, 2, 3]
    assert parse_variations("5,0,3") == [0, 3, 5]
    assert parse_variations("0-1,7") == [0, 1, 7]
    assert parse_variations(None) is None
    with pytest.raises(UserInputError, match="cannot parse"):
        parse_variations("3-1")
