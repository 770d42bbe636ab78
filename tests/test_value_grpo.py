"""GRPO of the value controller's option policy (`rir train grpo --value_adapter`): its decision points
and options, the direction of its update, and the whole command on the tiny model (online rewards,
logs, the adapter it writes, resuming)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = ["--model", "tiny-random-llama", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
        "--lora_target_modules", "q_proj", "v_proj"]  # fmt: skip


@pytest.fixture(scope="module")
def value_adapter(value_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    from rir_runtime.cli import main as rir

    out = tmp_path_factory.mktemp("start") / "value"
    argv = ["train", "value", *TINY, "--data", str(value_data), "--output_dir", str(out), "--max_steps", "1",
            "--per_device_train_batch_size", "2", "--save_strategy", "no", "--eval_strategy", "no",
            "--calibration_rows", "16"]  # fmt: skip
    assert rir(argv) == 0
    return out


def one_point_trainer(adapter: Path, data: Path, out: Path, temperature: str) -> tuple:
    """(GRPO trainer of a value adapter, its card) on one point whose options differ, with table rewards:
    64 samples, one constant-rate step, the rewards unscaled, so a step's direction is the policy's."""
    from train.common.args import parse_train_args
    from train.grpo import make_parser
    from train.value_grpo import build_trainer

    argv = [*TINY, "--value_adapter", str(adapter), "--data", str(data), "--reward", "table",
            "--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "64",
            "--per_device_eval_batch_size", "64", "--num_generations", "64", "--temperature", temperature,
            "--learning_rate", "0.001", "--spread_only", "true", "--max_train_samples", "1",
            "--save_strategy", "no", "--eval_strategy", "no", "--scale_rewards", "none",
            "--lr_scheduler_type", "constant"]  # fmt: skip
    return build_trainer(*parse_train_args(make_parser(), argv))


def raises_expected_value(trainer, point) -> bool:
    """Whether the trainer's update raises the policy's expected table value at `point`."""
    import torch

    def expected_value() -> float:
        trainer.model.eval()  # no LoRA dropout in the measurement
        with torch.no_grad():
            probs = trainer.log_probs(trainer.model, point).exp().tolist()
        return sum(p * v for p, v in zip(probs, point.values, strict=True))

    before = expected_value()
    trainer.train()
    return expected_value() > before


def test_decision_points_carry_every_option_with_its_value_once(value_data: Path) -> None:  # noqa: F811
    from datasets import load_from_disk

    from train.value_grpo import option_points

    rows = load_from_disk(str(value_data / "value_pref"))["train"]
    points = option_points(rows)
    assert 0 < len(points) < len(rows)  # a point's pairs share it
    for point in points:
        assert len(set(point.options)) == len(point.options) == len(point.texts) == len(point.values)
        assert point.options[0] is None or None not in point.options  # going on first, where it is an option
        assert list(point.options[1:]) == sorted(point.options[1:], reverse=True)  # then the latest first
        assert point.job and json.loads(point.job)["task"][0] == "builtin"
    pairs = {(r["meta"]["episode_id"], r["meta"]["step"], r["chosen"], r["rejected"]) for r in rows}
    point = points[0]
    values = dict(zip(point.texts, point.values, strict=True))
    for _, _, chosen, rejected in (p for p in pairs if p[2] in values and p[3] in values):
        assert values[chosen] >= values[rejected]


def test_balance_sources_shares_the_train_points_between_rollout_folders(value_data: Path, tmp_path: Path) -> None:  # noqa: F811
    """A build whose points come mostly from one folder: with `balance_sources` each folder gives half
    of the capped train points; without it, the cap takes them as they come."""
    from collections import Counter
    from types import SimpleNamespace

    from datasets import load_from_disk

    from train.value_grpo import load_points

    pairs = load_from_disk(str(value_data / "value_pref"))
    points = Counter((m["episode_id"], m["step"]) for m in pairs["train"]["meta"])
    few = set(sorted(points)[: len(points) // 5])  # a fifth of the points come from another folder

    def relabel(meta: dict) -> dict:
        return {"meta": {**meta, "source_run": "other" if (meta["episode_id"], meta["step"]) in few else "big"}}

    pairs.map(relabel, input_columns="meta").save_to_disk(str(tmp_path / "value_pref"))
    args = SimpleNamespace(data=str(tmp_path), spread_only=False, train_split="train", balance_sources=False)
    other = sum(p.source == "other" for p in load_points(args, "train", None, 0, online=False))
    assert Counter(p.source for p in load_points(args, "train", 2 * other, 0, online=False))["other"] < other
    args.balance_sources = True
    balanced = Counter(p.source for p in load_points(args, "train", 2 * other, 0, online=False))
    assert balanced["other"] == balanced["big"] == other


def test_updates_raise_the_expected_value_of_the_policy(value_data: Path, value_adapter: Path, tmp_path: Path) -> None:  # noqa: F811
    """Table rewards on one point whose options differ: after a step the softmax policy puts more
    probability on the options of higher value (its expected value rises); a sign error lowers it."""
    trainer, card = one_point_trainer(value_adapter, value_data, tmp_path / "out", temperature="5")
    point = trainer.train_dataset[0]
    assert point.spread > 0 and card["kind"] == "value"
    assert raises_expected_value(trainer, point)


def test_hard_points_are_those_whose_served_option_earns_less_than_the_best(
    value_data: Path,  # noqa: F811
    value_adapter: Path,
    tmp_path: Path,
) -> None:
    """`--hard_points` keeps the points where the start's best-scored option is not the best one: by
    the table's values, or (online) by what each option earned when played out, whatever the table says."""
    from train.common.args import parse_train_args
    from train.common.online_rewards import Group
    from train.grpo import make_parser
    from train.value_grpo import load_points, missed_points, point_scores, trainable_value_model

    argv = [*TINY, "--value_adapter", str(value_adapter), "--data", str(value_data), "--output_dir", str(tmp_path),
            "--spread_only", "true"]  # fmt: skip
    script_args, training_args, model_args = parse_train_args(make_parser(), argv)
    model, tokenizer, _ = trainable_value_model(str(value_adapter), model_args, training_args)
    points = load_points(script_args, "train", 12, 0, online=False)
    picks = [int(point_scores(model, tokenizer, p, lm_head=False).argmax()) for p in points]

    by_table = [p for p, i in zip(points, picks, strict=True) if p.values[i] < max(p.values)]
    assert missed_points(model, tokenizer, points, False, reward=None) == by_table

    class FirstOptionWins:  # online: only each point's first option succeeds when played out
        def play(self, groups: list[Group]) -> dict[Group, list[float]]:
            return {g: [1.0] + [0.0] * (len(g.decisions) - 1) for g in groups}

    online = missed_points(model, tokenizer, points, False, reward=FirstOptionWins())  # type: ignore[arg-type]
    assert online == [p for p, i in zip(points, picks, strict=True) if i != 0]
    assert 0 < len(online) < len(points) and 0 < len(by_table) < len(points)  # a real selection, not all or none


def test_a_resumed_run_reads_its_hard_points_back_instead_of_screening_again(value_data: Path, tmp_path: Path) -> None:  # noqa: F811
    """The screen's choice is kept beside the run: the same settings and candidates read it back (no
    second screen), other candidates or settings screen again."""
    from types import SimpleNamespace

    from train.value_grpo import kept_screen, load_points

    args = SimpleNamespace(data=str(value_data), spread_only=True, train_split="train", balance_sources=False)
    points = load_points(args, "train", 6, 0, online=False)
    calls: list[int] = []

    def screen(candidates: list) -> list:
        calls.append(len(candidates))
        return candidates[::2]

    path, settings = tmp_path / "hard_points-train.json", {"hard_points": "table"}
    first = kept_screen(path, settings, points, screen)
    assert kept_screen(path, settings, points, screen) == first == points[::2] and calls == [6]
    assert kept_screen(path, settings, points[:4], screen) == points[:4:2] and calls == [6, 4]
    assert kept_screen(path, {"hard_points": "online"}, points[:4], screen) == points[:4:2] and calls == [6, 4, 4]


def test_online_value_grpo_plays_options_out_logs_writes_a_value_adapter_and_resumes(
    value_data: Path,  # noqa: F811
    value_adapter: Path,
    tmp_path: Path,
) -> None:
    from rir_runtime.cli import main as rir
    from rir_runtime.controllers import make_controller
    from rir_runtime.controllers.value import ValueController

    out = tmp_path / "grpo"
    argv = ["train", "grpo", *TINY, "--value_adapter", str(value_adapter), "--data", str(value_data),
            "--reward", "online", "--output_dir", str(out), "--per_device_train_batch_size", "6",
            "--per_device_eval_batch_size", "6", "--num_generations", "3", "--gradient_accumulation_steps", "1",
            "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "1", "--eval_strategy", "steps", "--eval_steps", "2",
            "--max_eval_samples", "2", "--calibration_rows", "16", "--sft_adapter", ""]  # fmt: skip
    assert rir([*argv, "--max_steps", "2"]) == 0
    assert rir([*argv, "--max_steps", "3"]) == 0  # resumes from checkpoint-2
    state = json.loads((out / "trainer_state.json").read_text())
    train_logs = [e for e in state["log_history"] if "reward" in e]
    assert [e["step"] for e in train_logs] == [1, 2, 3]
    for entry in train_logs:
        assert 0.0 <= entry["recover_share"] <= 1.0 and entry["entropy"] >= 0.0
        assert entry["online/reward_evaluations"] == 6  # 2 points x 3 options, each played out
        assert entry["time/generation_s"] > 0 and entry["time/backward_s"] > 0, entry  # the step's split
        assert entry["time/rewards_s"] >= entry["online/reward_seconds"] > 0, entry
    assert any("eval_reward" in e for e in state["log_history"])
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["kind"] == "value" and card["stage"] == "grpo" and card["rewards"]["reward"] == "online"
    assert card["value_adapter"] == str(value_adapter) and card["review_threshold"] is not None
    assert isinstance(make_controller(f"value:{out}"), ValueController)


def test_grpo_of_a_where_only_lm_adapter_trains_the_scores_it_is_served_with_over_restores(
    value_data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An lm-head adapter of the Where alone: its points offer the restores only (as its served Where
    does), the trained scores are the served log-probabilities, an update raises the policy's expected
    value, and the adapter written keeps the start's head and decisions (served with the rule's When)."""
    import torch

    from rir_runtime.cli import main as rir
    from rir_runtime.controllers import make_controller
    from rir_runtime.controllers.value import ValueController
    from rir_runtime.llm.value import load_value_scorer

    start = tmp_path / "where"
    assert rir(["train", "value", *TINY, "--value_head", "lm", "--decision_types", "locate",
                "--data", str(value_data), "--output_dir", str(start), "--max_steps", "1",
                "--save_strategy", "no", "--eval_strategy", "no"]) == 0  # fmt: skip
    # a random model's log-probabilities of two option texts differ by tens of nats: a hot policy samples both
    trainer, card = one_point_trainer(start, value_data, tmp_path / "out", temperature="100")
    point = trainer.train_dataset[0]
    assert None not in point.options and point.spread > 0
    assert card["extra"]["value_head"] == "lm" and card["decision_types"] == ["locate"]
    trainer.model.eval()
    with torch.no_grad():
        trained = trainer.scores(trainer.model, point).tolist()
    assert trained == pytest.approx(load_value_scorer(start).score(point.prompt, list(point.texts)), abs=1e-3)
    assert raises_expected_value(trainer, point)

    out = tmp_path / "grpo"
    assert rir(["train", "grpo", *TINY, "--value_adapter", str(start), "--data", str(value_data), "--reward", "table",
                "--output_dir", str(out), "--max_steps", "1",
                "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_train_samples", "2",
                "--save_strategy", "no", "--eval_strategy", "no", "--sft_adapter", ""]) == 0  # fmt: skip
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["value_head"] == "lm" and card["decision_types"] == ["locate"] and "review_threshold" not in card
    controller = make_controller(f"value:{out}")
    assert isinstance(controller, ValueController) and controller.where_only


VALUE_GRPO_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "train").glob("grpo_*value*.yaml"))


@pytest.mark.parametrize("config", VALUE_GRPO_CONFIGS, ids=[c.stem for c in VALUE_GRPO_CONFIGS])
def test_shipped_value_grpo_config_builds_and_trains_one_step(
    config: Path,
    value_data: Path,  # noqa: F811
    value_adapter: Path,
    tmp_path: Path,
) -> None:
    from train.common.args import parse_train_args
    from train.grpo import make_parser
    from train.value_grpo import build_trainer

    argv = ["--config", str(config), "--value_adapter", str(value_adapter), "--data", str(value_data),
            "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--max_train_samples", "4",
            "--gradient_accumulation_steps", "1", "--save_strategy", "no"]  # fmt: skip
    trainer, card = build_trainer(*parse_train_args(make_parser(), argv))
    trainer.train()
    assert card["kind"] == "value" and trainer.state.global_step == 1
    assert any("reward" in entry for entry in trainer.state.log_history)
