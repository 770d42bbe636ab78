"""Rollouts, hindsight labels and datasets on the built-in workshop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_gen.build import build, load_runs
from data_gen.build_config import BuildConfig
from data_gen.hindsight import label_point
from data_gen.points import decision_points
from data_gen.rollout import RolloutConfig, rollout, rollout_jobs, shard_jobs
from data_gen.splits import variation_key
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.config import build_config
from rir_runtime.trace import TRACE_SCHEMA_VERSION, read_records
from rir_runtime.values import ValueProbe, latest_best_bisect, latest_best_linear


def small_rollout(out: Path, **kw) -> RolloutConfig:
    cfg = RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-11", out=str(out), **kw)
    rollout(cfg)
    return cfg


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rollout")
    small_rollout(out)
    return out


@pytest.fixture(scope="module")
def data_dir(run_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    build(BuildConfig(rollouts=[str(run_dir)], out=str(out)))
    return out


def test_rollout_resumes_after_a_kill_without_duplicates(tmp_path: Path) -> None:
    cfg = small_rollout(tmp_path)
    path = tmp_path / "episodes-0.jsonl"
    lines = path.read_text().splitlines()
    total = len(lines)
    path.write_text("\n".join(lines[:10]) + "\n" + lines[10][:25])  # killed mid-write after 10 episodes
    with pytest.warns(UserWarning, match="partial last line"):
        rollout(cfg)
    ids = [r.episode_id for r in read_records(path)]
    assert len(ids) == len(set(ids)) == total == len(rollout_jobs(cfg))


def test_a_build_does_not_depend_on_the_order_workers_wrote_the_episodes(run_dir: Path, tmp_path: Path) -> None:
    """Parallel rollout workers append episodes as they finish; the same episodes in another order
    must give the same datasets, row for row (a seeded shuffle then draws the same training pairs)."""
    from datasets import load_from_disk

    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    (shuffled / "run.json").write_text((run_dir / "run.json").read_text())
    lines = (run_dir / "episodes-0.jsonl").read_text().splitlines()
    (shuffled / "episodes-0.jsonl").write_text("\n".join(lines[::-1]) + "\n")
    for name, folder in (("a", run_dir), ("b", shuffled)):
        build(BuildConfig(rollouts=[str(folder)], out=str(tmp_path / name)))
    for dataset in ("review_sft", "value_pref"):
        a, b = (load_from_disk(str(tmp_path / n / dataset))["train"] for n in "ab")
        assert len(a) > 0 and a["prompt"] == b["prompt"]
        assert [m["episode_id"] for m in a["meta"]] == [m["episode_id"] for m in b["meta"]]


def test_rollout_refuses_a_different_config_in_the_same_folder(run_dir: Path) -> None:
    with pytest.raises(UserInputError, match="different config.*error_rate"):
        rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-11", out=str(run_dir), error_rate=0.5))


def test_shards_partition_the_job() -> None:
    cfg = RolloutConfig(env="builtin", tasks=["workshop-2"], variations="0-6")
    jobs = rollout_jobs(cfg)
    parts = [shard_jobs(jobs, i, 3) for i in range(3)]
    assert sorted(j.episode_id for p in parts for j in p) == sorted(j.episode_id for j in jobs)
    with pytest.raises(UserInputError, match="shard '3/3' does not exist"):
        build_config(RolloutConfig, {"shard": "3/3"})
    with pytest.raises(UserInputError, match="leaves some shards empty"):
        shard_jobs(jobs, 0, len(jobs) + 1)


@pytest.mark.parametrize("variation", range(12))
def test_bisection_agrees_with_the_linear_scan(run_dir: Path, variation: int) -> None:
    episodes = [e for e, _ in load_runs([str(run_dir)]) if e.variation == variation]
    env = WorkshopEnv()
    for episode in episodes:
        for point in decision_points(episode):
            a, b = label_point(env, point, bisect=True), label_point(env, point, bisect=False)
            assert (a.restore, a.review, a.segment) == (b.restore, b.review, b.segment)
            assert a.probes <= b.probes


def test_bisection_is_logarithmic_on_a_monotone_branch() -> None:
    values = [1.0] * 37 + [0.0] * 63
    calls: list[int] = []

    def value(i: int) -> float:
        calls.append(i)
        return values[i]

    assert (
        latest_best_bisect(list(range(100)), value)[0]
        == 36
        == latest_best_linear(list(range(100)), values.__getitem__)[0]
    )
    assert len(calls) <= 9


def test_restore_label_is_the_step_before_the_fatal_error(run_dir: Path) -> None:
    env = WorkshopEnv()
    checked = 0
    for episode, _ in load_runs([str(run_dir)]):
        for point in decision_points(episode):
            label = label_point(env, point)
            if label.review != "recover":
                continue
            env.reset(point.task)
            fatal = None
            for step in point.history:  # ground truth: the first step that ruins the workshop
                result = env.step(step.action)
                if env.ruined_ingredients() or result.lost:
                    fatal = step.index
                    break
            assert label.restore == fatal
            checked += 1
    assert checked >= 5


def test_value_probe_leaves_the_env_where_it_was() -> None:
    env = WorkshopEnv()
    task = TaskSpec("builtin", "workshop-3", "dev", 2)
    env.reset(task)
    start = env.checkpoint()
    for action in env.expert_actions()[:4]:
        env.step(action)
    here = env.checkpoint()
    probe = ValueProbe(env)
    assert probe.value(start) == 1.0 and probe.env_steps > 0
    assert env.checkpoint().actions == here.actions


def test_datasets_have_trl_formats_and_disjoint_variations(data_dir: Path) -> None:
    from datasets import load_from_disk
    from trl.data_utils import is_conversational

    for name in ("review_sft", "locate_sft", "reflect_sft", "review_pref", "locate_pref"):
        dataset = load_from_disk(str(data_dir / name))
        assert set(dataset) >= {"train"}, name
        cols = {"prompt", "completion", "meta"} if name.endswith("_sft") else {"prompt", "chosen", "rejected", "meta"}
        assert set(dataset["train"].column_names) == cols
        row = dataset["train"][0]
        assert is_conversational(row)
        assert row["prompt"][-1]["role"] == "user"
        targets = [row["completion"]] if name.endswith("_sft") else [row["chosen"], row["rejected"]]
        for t in targets:
            assert len(t) == 1 and t[0]["role"] == "assistant" and json.loads(t[0]["content"])
        if "validation" in dataset:
            train = {variation_key(m) for m in dataset["train"]["meta"]}
            val = {variation_key(m) for m in dataset["validation"]["meta"]}
            assert train and val and not train & val, name
        assert (data_dir / name / "README.md").read_text().count("| train |") == 1


def test_review_labels_hold_both_decisions(data_dir: Path) -> None:
    from datasets import load_from_disk

    labels = {m["label"] for m in load_from_disk(str(data_dir / "review_sft"))["train"]["meta"]}
    assert labels == {"recover", "continue"}


def test_a_failed_ending_gives_where_rows_but_no_when_row(run_dir: Path, data_dir: Path) -> None:
    """The runtime recovers after a failed ending without asking the When, so terminal reviews
    teach the Where (and What) but are no review rows."""
    from datasets import load_from_disk

    def triggers(name: str) -> list[str]:
        rows = [m for split in load_from_disk(str(data_dir / name)).values() for m in split["meta"]]
        return [json.loads(m["context"])["trigger"] for m in rows]

    points = [p for episode, _ in load_runs([str(run_dir)]) for p in decision_points(episode)]
    terminal = [p for p in points if p.trigger == "terminal"]
    assert terminal and len(terminal) < len(points)
    assert "terminal" not in triggers("review_sft") and triggers("review_sft")
    located = {
        (m["episode_id"], m["step"])
        for split in load_from_disk(str(data_dir / "locate_sft")).values()
        for m in split["meta"]
    }
    assert any((p.record.episode_id, len(p.history)) in located for p in terminal)


def test_prompt_bound_cuts_the_middle(run_dir: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path), max_prompt_tokens=150))
    row = load_from_disk(str(tmp_path / "review_sft"))["train"][0]
    text = row["prompt"][-1]["content"]
    assert "Task:" in text and "Now:" in text
    long_rows = [r for r in load_from_disk(str(tmp_path / "review_sft"))["train"] if r["meta"]["step"] > 6]
    assert any("steps omitted" in r["prompt"][-1]["content"] for r in long_rows)


def test_bad_runs_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="not a rollout folder"):
        load_runs([str(tmp_path)])
    (tmp_path / "run.json").write_text(json.dumps({"schema": 0}))
    with pytest.raises(UserInputError, match="schema 0"):
        load_runs([str(tmp_path)])
    (tmp_path / "run.json").write_text(json.dumps({"schema": 1}))
    with pytest.raises(UserInputError, match="rir trace upgrade"):
        load_runs([str(tmp_path)])
    (tmp_path / "run.json").write_text(json.dumps({"schema": TRACE_SCHEMA_VERSION}))
    with pytest.raises(UserInputError, match="no finished episodes"):
        load_runs([str(tmp_path)])


def test_tokenizer_bound_counts_the_tokenizer_s_tokens() -> None:
    pytest.importorskip("transformers")
    from data_gen.rows import token_counter

    messages = [{"role": "user", "content": "x" * 300}]
    assert token_counter("tiny-random-llama")(messages) >= 300  # a byte tokenizer: a token per character
