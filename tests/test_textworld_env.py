"""TextWorld cooking adapter against real generated games: expert win, native restore, losing, cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from rir_runtime.envs import TaskSpec, make_env  # noqa: E402
from rir_runtime.errors import UnknownNameError  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]

SIMPLE = TaskSpec("textworld-cooking", "recipe1", "train", 0)
PREP = TaskSpec("textworld-cooking", "recipe1-prep", "train", 0)  # cooking and cutting matter


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rir-cache")


@pytest.fixture(scope="module")
def env(cache: Path):
    with make_env("textworld-cooking", cache_dir=cache) as e:
        yield e


def test_expert_plan_wins(env) -> None:
    obs = env.reset(SIMPLE)
    assert obs.objective and "cookbook" in obs.objective and obs.score == 0
    assert "$$" not in obs.text and not obs.text.rstrip().endswith(">")
    assert env.admissible_actions() == sorted(env.admissible_actions())
    plan = env.expert_actions()
    assert plan
    for action in plan:
        result = env.step(action)
    assert result.won and result.done and not result.lost
    assert result.score == result.info["max_score"] > 0


def test_native_checkpoint_restore(env) -> None:
    env.reset(PREP)
    plan = env.expert_actions()
    assert len(plan) >= 5
    for action in plan[:2]:
        env.step(action)
    snap = env.checkpoint()
    assert snap.kind == "native" and snap.actions == tuple(plan[:2])
    expert_there = env.expert_actions()
    after = [env.step(a) for a in plan[2:4]]
    for _ in range(2):  # the same snapshot restores more than once
        obs = env.restore(snap)
        assert (obs.text, obs.score) == (snap.observation, snap.score)
        assert env.expert_actions() == expert_there
        again = env.step(plan[2])
        assert (again.observation, again.score, again.reward) == (after[0].observation, after[0].score, after[0].reward)
    assert env.native_failures == 0


def test_burning_loses_and_restore_recovers(env) -> None:
    env.reset(PREP)
    plan = env.expert_actions()
    cook = next(i for i, a in enumerate(plan) if a.startswith("cook "))
    for action in plan[: cook + 1]:
        env.step(action)
    snap = env.checkpoint()
    burned = env.step(plan[cook])  # cooking it a second time burns it
    assert burned.lost and burned.done and not burned.won
    assert env.step("look").done  # the ended game stays ended
    env.restore(snap)
    for action in env.expert_actions():
        result = env.step(action)
    assert result.won


def test_replay_restore_matches(cache: Path) -> None:
    with make_env("textworld-cooking", cache_dir=cache, native_snapshots=False) as e:
        e.reset(PREP)
        plan = e.expert_actions()
        for action in plan[:3]:
            e.step(action)
        snap = e.checkpoint()
        assert snap.kind == "replay"
        nxt = e.step(plan[3])
        assert e.restore(snap).text == snap.observation
        assert e.step(plan[3]).observation == nxt.observation


def test_cache_is_reused(env, cache: Path) -> None:
    path = env.game_file(SIMPLE)
    mtime = path.stat().st_mtime_ns
    with make_env("textworld-cooking", cache_dir=cache) as other:
        assert other.game_file(SIMPLE) == path
        other.reset(SIMPLE)
    assert path.stat().st_mtime_ns == mtime
    assert path.parts[-4:] == ("textworld", "recipe1", "train", "10000.z8")
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_truncated_cached_game_is_regenerated(env, cache: Path, tmp_path: Path) -> None:
    src = env.game_file(SIMPLE)
    dst = tmp_path / "textworld" / "recipe1" / "train"
    dst.mkdir(parents=True)
    shutil.copy(src.with_suffix(".json"), dst)
    (dst / src.name).write_bytes(src.read_bytes()[:1000])  # as if a copy was cut short
    regenerated: list[int] = []

    def fake_generate(preset: str, split: str, seed: int, path: Path) -> None:  # a copy instead of 5 s of tw-make
        regenerated.append(seed)
        shutil.copy(src, path)

    with make_env("textworld-cooking", cache_dir=tmp_path) as e:
        e._generate = fake_generate
        assert e.reset(SIMPLE).objective
    assert regenerated == [10000] and (dst / src.name).stat().st_size == src.stat().st_size


def test_unknown_preset(env) -> None:
    with pytest.raises(UnknownNameError, match="recipe1"):
        env.num_variations("recipe9", "train")
    with pytest.raises(UnknownNameError):
        env.reset(TaskSpec("textworld-cooking", "recipe9", "train", 0))


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))
    with make_env("textworld-cooking") as e:
        assert e.cache_dir == tmp_path / "textworld"
