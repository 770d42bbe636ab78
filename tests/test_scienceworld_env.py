"""ScienceWorld adapter against the real simulator (one JVM for the module): catalogue, replay
restore, expert path, winning, losing by a wrong focus, and clear errors for bad task specs."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("scienceworld")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs a Java runtime", allow_module_level=True)

from rir_runtime.envs import TaskSpec, make_env, resolve_tasks  # noqa: E402
from rir_runtime.envs.scienceworld_env import MAX_VARIATIONS, compact_look, split_variations  # noqa: E402
from rir_runtime.errors import UnknownNameError, UserInputError  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]

BOIL = TaskSpec("scienceworld", "boil", "dev", 0)
FIND = TaskSpec("scienceworld", "find-living-thing", "dev", 0)  # short gold path (8 actions)


@pytest.fixture(scope="module")
def env():
    with make_env("scienceworld") as e:
        yield e


@pytest.fixture(scope="module")
def boil_gold(env) -> list[str]:
    env.reset(BOIL)
    return env.gold_actions()


def test_catalogue_matches_engine(env) -> None:
    from scienceworld.constants import ID2TASK

    names = type(env).task_names()
    assert len(names) == 30 and names == list(ID2TASK.values())
    server = env._engine().server
    assert env.deterministic, "JVM did not accept the determinism flags"
    assert sorted(server.getTaskNames()) == sorted(names)
    assert {t: server.getTaskMaxVariations(t) for t in names} == MAX_VARIATIONS
    env.reset(BOIL)
    sw = env._sw
    engine_splits = {
        "train": sw.get_variations_train(),
        "dev": sw.get_variations_dev(),
        "test": sw.get_variations_test(),
    }
    assert engine_splits == split_variations(MAX_VARIATIONS["boil"])
    assert env.num_variations("boil", "dev") == 7
    assert [s.variation for s in resolve_tasks(env, ["boil"], "dev", None)] == list(range(7))


def test_checkpoint_restore_replays_exactly(env, boil_gold: list[str]) -> None:
    obs = env.reset(BOIL)
    assert obs.objective.startswith("Your task is to boil") and obs.text and obs.score == 0
    for action in boil_gold[:5]:
        assert not env.step(action).done
    snap = env.checkpoint()
    assert snap.kind == "replay" and snap.actions == tuple(boil_gold[:5])
    first = [env.step(a) for a in boil_gold[5:8]]
    env.admissible_actions()  # lists valid actions mid-branch: must not perturb later replays
    restored = env.restore(snap)
    assert (restored.text, restored.score) == (snap.observation, snap.score)
    assert env.checkpoint().actions == snap.actions
    again = env.step(boil_gold[5])
    assert (again.observation, again.score) == (first[0].observation, first[0].score)
    assert env.replay_divergences == 0


def test_expert_actions_follow_gold_prefix(env, boil_gold: list[str]) -> None:
    env.reset(BOIL)
    assert env.expert_actions() == boil_gold
    env.step(boil_gold[0])
    env.step(boil_gold[1])
    assert env.expert_actions() == boil_gold[2:]
    assert boil_gold[2] != "inventory"
    env.step("inventory")
    assert env.expert_actions() == []  # off the gold path there is no oracle


def test_admissible_actions_deterministic_and_rng_neutral(env) -> None:
    env.reset(FIND)
    rnd, seed = env._rng[0], env._rng[1]
    before = seed.get(rnd)
    acts = env.admissible_actions()
    assert seed.get(rnd) == before
    assert acts == sorted(set(acts)) and "look around" in acts
    assert env.admissible_actions() == acts


def test_listing_holds_the_gold_path(env) -> None:
    """A policy restricted to listed actions (constrain mode) can walk the expert's way: the open
    doors' "open door to X" is listed, though ScienceWorld itself omits it."""
    env.reset(FIND)
    unlisted = []
    for action in env.expert_actions():
        listed = env.admissible_actions()
        if action not in listed:
            unlisted.append(action)
        env.step(action)
    assert any(a.startswith("open door to") for a in env.gold_actions())
    assert len(unlisted) == 1 and " in inventory to " in unlisted[0]  # listed as "move X to Y"


def test_gold_path_wins(env) -> None:
    env.reset(FIND)
    plan = env.expert_actions()
    assert plan
    results = [env.step(a) for a in plan]
    assert all(not r.done for r in results[:-1])
    last = results[-1]
    assert last.won and last.done and not last.lost and last.score == 100
    assert sum(r.reward for r in results) == 100
    assert env.expert_actions() == []


def test_wrong_focus_loses(env) -> None:
    env.reset(FIND)
    result = env.step("focus on air")  # air is not a living thing
    assert result.lost and result.done and not result.won and result.score < 0


def test_step_limit_ends_episode(env) -> None:
    env.step_limit = 2
    try:
        env.reset(FIND)
        assert not env.step("look around").done
        last = env.step("look around")
        assert last.done and last.info["step_limit_reached"] and not last.won
    finally:
        env.step_limit = 100


def test_bad_task_specs_fail_clearly(env) -> None:
    with pytest.raises(UnknownNameError, match="boil"):
        env.reset(TaskSpec("scienceworld", "boill", "dev", 0))
    with pytest.raises(UnknownNameError):
        env.num_variations("no-such-task", "dev")
    with pytest.raises(UserInputError, match="0-6"):
        env.reset(TaskSpec("scienceworld", "boil", "dev", 7))


def test_room_descriptions_list_doors_first_and_moving_shows_the_new_room(env) -> None:
    obs = env.reset(TaskSpec("scienceworld", "lifespan-longest-lived", "train", 2))  # starts in the kitchen
    assert obs.text.startswith("This room is called the kitchen. Doors to: bathroom, hallway, outside. Here you see: ")
    env.step("open door to outside")
    moved = env.step("go to outside").observation
    assert moved.startswith("You move to the outside. This room is called the outside. Doors to: foundry, greenhouse")
    assert "giant tortoise egg" in moved  # the animals the task is about are in view
    assert env.step("focus on egg giant tortoise").won


def test_compact_look_keeps_other_text_and_marks_closed_doors() -> None:
    look = (
        "This room is called the bedroom. In it, you see: \n\tthe agent\n\ta substance called air\n"
        "\ta bed. On the bed is: a mattress.\nYou also see:\n\tA door to the hallway (that is closed)"
    )
    assert compact_look(look) == "This room is called the bedroom. Doors to: hallway (closed). Here you see: a bed."
    assert compact_look("The door is already open.") == "The door is already open."


def test_a_gold_path_does_not_depend_on_what_the_engine_loaded_before(env) -> None:
    """test-conductivity train 88's gold path ran through the living room when generated in an engine
    that had generated 86's (whose path goes there), through the workshop in a fresh one."""
    after_86 = TaskSpec("scienceworld", "test-conductivity", "train", 88)
    env.reset(TaskSpec("scienceworld", "test-conductivity", "train", 86))
    assert "go to living room" in env.gold_actions()
    env.reset(after_86)
    with make_env("scienceworld") as fresh:
        fresh.reset(after_86)
        assert env.gold_actions() == fresh.gold_actions()
        assert "go to workshop" in fresh.gold_actions()
