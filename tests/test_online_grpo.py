"""Online GRPO rewards: every sampled decision of a group is played out from its decision point's one
restored state, and its reward is what the runtime gives for that decision, less the stated costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rir_runtime.branching import Forced
from rir_runtime.orchestration.jobs import EpisodeJob, branch_job
from rir_runtime.trace import replay
from tests.training import FAST
from train.common.online_rewards import OnlineReward, forced_decision


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from data_gen.build import build
    from data_gen.build_config import BuildConfig
    from data_gen.rollout import RolloutConfig, rollout

    root = tmp_path_factory.mktemp("online")
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], split="train", variations="0-9", methods=["rir"],
                          budget_agent="40", budget_rollback=1, review_interval=4, error_rate=0.3,
                          out=str(root / "rollout")))  # fmt: skip
    build(BuildConfig(rollouts=[str(root / "rollout")], out=str(root / "data")))
    return root / "data"


def review_rows(data: Path) -> list[dict]:
    from datasets import load_from_disk

    from data_gen.scoring.rewards import view_row

    rows = load_from_disk(str(data / "review_sft"))["train"]
    return [{**view_row(r, {}), "prompt": r["prompt"]} for r in rows]


def call(reward: OnlineReward, row: dict, replies: list[str]) -> list[float | None]:
    n = len(replies)
    columns = {k: [row[k]] * n for k in ("decision", "choices", "segments", "job", "review_index")}
    return reward(completions=replies, opening=[""] * n, **columns)


def test_rows_name_the_decision_point_they_were_made_at(data: Path) -> None:
    for row in review_rows(data):
        job = EpisodeJob.from_json(row["job"])
        assert job.task.split == "train" and row["review_index"] >= 0
        assert EpisodeJob.from_json(job.to_json()) == job


def test_a_groups_decisions_start_from_one_state_and_are_rewarded_by_what_they_did(data: Path) -> None:
    reward = OnlineReward(rollback_cost=0.1)
    replies = ['{"decision": "continue", "reason": "x"}', '{"decision": "recover", "reason": "x"}', "not json"]
    rewarded = 0
    for row in review_rows(data)[:12]:
        got = call(reward, row, replies)
        assert got[2] == 0.0  # a reply that states no decision earns nothing and is not played
        assert all(len(states) == 1 for states in reward.fingerprints.values())  # one state per group
        job = EpisodeJob.from_json(row["job"])
        expected = branch_job(job, row["review_index"], [Forced(False), Forced(True)])
        for value, outcome in zip(got[:2], expected, strict=True):
            assert value == pytest.approx(float(outcome.success) - 0.1 * outcome.rollbacks)
        rewarded += 1
    assert rewarded and reward.stats["restores"] == 2 * rewarded


def test_a_point_the_replay_no_longer_reaches_earns_no_reward_and_is_counted(data: Path, caplog) -> None:
    row = review_rows(data)[0]
    unreachable = {**row, "review_index": 99}  # as if the environment acted otherwise than when recorded
    reward = OnlineReward()
    replies = ['{"decision": "continue", "reason": "x"}', '{"decision": "recover", "reason": "x"}']
    with caplog.at_level("WARNING"):
        assert call(reward, unreachable, replies) == [0.0, 0.0]
    assert reward.stats["unreached"] == 1 and reward.stats["restores"] == 0
    assert "ended before its review 99" in caplog.text
    got = call(reward, row, replies)  # the run goes on: the next point is played as usual
    assert reward.stats["unreached"] == 1 and reward.stats["restores"] == 2
    expected = branch_job(EpisodeJob.from_json(row["job"]), row["review_index"], [Forced(False), Forced(True)])
    assert got == [pytest.approx(float(o.success) - 0.05 * o.rollbacks) for o in expected]


def test_fresh_draws_reward_a_decision_by_its_mean_over_the_agents_noise_drawn_afresh(data: Path) -> None:
    """With `draws` K a decision is played K times from the one state, continuation k = 1..K of the
    agent (never its own future, k = 0), and rewarded by the mean; some decisions' fresh draws disagree
    with the own future, which is what the draws are for."""
    reward = OnlineReward(rollback_cost=0.1, draws=3)
    replies = ['{"decision": "continue", "reason": "x"}', '{"decision": "recover", "reason": "x"}']
    differ = 0
    for row in review_rows(data)[:12]:
        got = call(reward, row, replies)
        assert all(len(states) == 1 for states in reward.fingerprints.values())
        job = EpisodeJob.from_json(row["job"])
        for value, decision in zip(got, [Forced(False), Forced(True)], strict=True):
            plays = branch_job(job, row["review_index"], [Forced(decision.recover, draw=k) for k in (1, 2, 3)])
            assert value == pytest.approx(sum(float(o.success) - 0.1 * o.rollbacks for o in plays) / 3)
            (own,) = branch_job(job, row["review_index"], [decision])
            differ += value != pytest.approx(float(own.success) - 0.1 * own.rollbacks)
    assert reward.stats["restores"] == 12 * 2 * 3 and differ > 0


def test_the_decision_the_episode_made_is_rewarded_with_the_episodes_own_outcome(data: Path) -> None:
    from rir_runtime.orchestration.jobs import run_job

    reward = OnlineReward(rollback_cost=0.0)
    for row in review_rows(data)[:12]:
        job = EpisodeJob.from_json(row["job"])
        record = run_job(job)
        made = replay(record).reviews[row["review_index"]].review.decision
        (value,) = call(reward, row, [json.dumps({"decision": made, "reason": "x"})])
        assert value == float(record.success), (job.episode_id, made)


def test_replies_become_the_decisions_a_branch_forces() -> None:
    choices = {0: [0, 1, 2], 1: [3, 4]}
    assert forced_decision("review", '{"decision": "recover", "reason": "r"}', {}, []) == Forced(True)
    assert forced_decision("review", "{}", {}, []) is None
    assert forced_decision("locate_fine", '{"step": 4}', {4: [4], 2: [2]}, []) == Forced(True, restore_to=4)
    assert forced_decision("locate_fine", '{"step": 9}', {4: [4]}, []) is None  # not offered
    assert forced_decision("locate_coarse", '{"segment": 1}', choices, [[0, 3], [3, 5]]) == Forced(True, segment=(3, 5))


def train_grpo(argv: list[str]):
    from train import grpo
    from train.common.args import parse_train_args
    from train.common.run import train_and_save

    args = parse_train_args(grpo.make_parser(), argv)
    trainer, card = grpo.build_trainer(*args)
    return train_and_save(trainer, card, *args)


def test_online_grpo_trains_logs_its_restores_and_resumes(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random tiny model writes no decision a parser accepts; here each reply's bytes decide (parsing
    is tested above), so GRPO's samples are played out and rewarded."""
    import train.common.online_rewards

    monkeypatch.setattr(
        train.common.online_rewards, "review_verdict", lambda text: ("continue", "recover")[len(text) % 2]
    )
    config = Path(__file__).parent.parent / "configs/train/grpo_cpu_quick.yaml"
    argv = ["--config", str(config), "--model", "tiny-random-llama", "--sft_adapter", "", "--data", str(data),
            "--reward", "online", "--decision_types", "review", "--output_dir", str(tmp_path / "out"),
            "--save_strategy", "steps", "--save_steps", "1", "--logging_steps", "1", "--report_to", "none",
            "--use_cpu", "true", "--bf16", "false", "--eval_strategy", "no", "--calibrate_review", "false"]  # fmt: skip
    trainer = train_grpo([*argv, "--max_steps", "2"])
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2] and all("online/restores_per_s" in entry for entry in logs)
    assert sum(entry["online/reward_evaluations"] for entry in logs) > 0, logs  # decisions were played out
    for entry in logs:  # each step's seconds split by phase, and the played decisions inside the rewards' share
        assert entry["time/generation_s"] > 0 and entry["time/backward_s"] > 0, entry
        assert entry["time/rewards_s"] >= entry["online/reward_seconds"] > 0, entry
    card = json.loads((tmp_path / "out" / "rir_controller.json").read_text())
    assert card["stage"] == "grpo" and card["rewards"]["reward"] == "online"
    resumed = train_grpo([*argv, "--max_steps", "3"])  # the same output folder: it resumes at checkpoint 2
    assert resumed.state.global_step == 3
    steps = [entry["step"] for entry in resumed.state.log_history if "loss" in entry]
    assert steps == [1, 2, 3]  # the log of the first run, then one step more


ONLINE_CONFIGS = sorted(
    c for c in (Path(__file__).parent.parent / "configs" / "train").glob("grpo_online_*.yaml") if "value" not in c.name
)  # the value adapter's: tests/test_value_grpo.py


@pytest.mark.parametrize("config", ONLINE_CONFIGS, ids=[c.stem for c in ONLINE_CONFIGS])
def test_shipped_online_config_builds_and_trains_one_step(config: Path, data: Path, tmp_path: Path) -> None:
    """GPU configs too (vLLM off: this is a CPU), on the tiny model, from a fresh LoRA adapter."""

    argv = ["--config", str(config), *FAST, "--sft_adapter", "null", "--data", str(data), "--use_vllm", "false",
            "--reward_workers", "1", "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--num_generations", "2",
            "--max_train_samples", "4", "--eval_strategy", "no", "--calibrate_review", "false",
            "--save_strategy", "no"]  # fmt: skip
    trainer = train_grpo(argv)
    assert trainer.state.global_step == 1
    assert any("online/reward_evaluations" in entry for entry in trainer.state.log_history)
