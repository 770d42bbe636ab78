"""GRPO of a controller adapter on the tiny random Llama (built from a config): the dataset view, a CPU
smoke run from an SFT adapter, the shipped GRPO configs, and the `rir train grpo` command.

The data is written in the exact format `rir build-data` writes (`*_sft` DatasetDicts whose `meta`
holds the decision, label, serialised context and measured values). A random model never writes
JSON, so every reward would be 0 and no advantage would move the adapter: the smoke run starts from
an SFT adapter trained here until its samples are mostly valid answers, both right and wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rir_runtime.decisions import Review, dump  # noqa: E402
from rir_runtime.envs.checkpoints import Step  # noqa: E402
from rir_runtime.errors import UserInputError  # noqa: E402
from rir_runtime.prompts import DecisionContext, render_decision  # noqa: E402
from tests.training import FAST as TRAIN_FAST  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# the online configs need rows with decision points: tests/test_online_grpo.py trains them
GRPO_CONFIGS = sorted(c for c in (REPO / "configs" / "train").glob("grpo_*.yaml") if "online" not in c.name)
# Bisection over checkpoints 0..4 of a branch harmed at step 3 probes 0, 2, 3 and 4; 1 is implied.
MEASURED = {0: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
SEGMENTS = ((0, 2), (2, 5))
FAST = [*TRAIN_FAST, "--eval_strategy", "no"]  # GRPO evaluates nothing here


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A 2-core box shared with other jobs: one BLAS thread is many times faster than two fighting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- data ---------------------------------------------------------------------------------------
def context(i: int, kind: str) -> DecisionContext:
    steps = tuple(Step(k, f"act{k} {i}", "ok.", float(k)) for k in range(4))
    return DecisionContext(
        task="workshop-3",
        objective="Chill the apple.",
        memory="",
        history=steps,
        observation="ok.",
        score=3.0,
        admissible=(0, 1, 2, 3, 4),
        segments=SEGMENTS,
        segment=SEGMENTS[1] if kind == "locate_fine" else None,
    )


def sft_row(kind: str, i: int) -> dict[str, Any]:
    """Review rows: 1 in 4 says recover. Locate rows: half answer the label 2, half the harmful step 3
    (so the SFT policy samples both, and GRPO has something to prefer)."""
    label = ("recover" if i % 4 == 0 else "continue") if kind == "review" else "2"
    answer = dump("review", Review(label, "x")) if kind == "review" else dump("locate_fine", 2 + i % 2)  # type: ignore[arg-type]
    ctx = context(i, kind)
    meta = {
        "env": "builtin",
        "task": "workshop-3",
        "split": "train",
        "variation": i,
        "decision": kind,
        "label": label,
        "context": ctx.to_json(),
        "values": json.dumps({str(k): v for k, v in MEASURED.items()}),
        "v_now": 0.0,
    }
    prompt = render_decision(kind, ctx, max_steps=2)  # type: ignore[arg-type]
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": answer}], "meta": meta}


def write_data(root: Path, n_train: int = 8, n_val: int = 4) -> Path:
    from datasets import Dataset, DatasetDict

    for name, kind in (("review_sft", "review"), ("locate_sft", "locate_fine")):
        splits = {
            "train": Dataset.from_list([sft_row(kind, i) for i in range(n_train)]),
            "validation": Dataset.from_list([sft_row(kind, i) for i in range(n_train, n_train + n_val)]),
        }
        DatasetDict(splits).save_to_disk(str(root / name))
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data"))


def parse(stage: str, argv: list[str]):
    from train import grpo, sft
    from train.common.args import parse_train_args

    return parse_train_args((grpo if stage == "grpo" else sft).make_parser(), argv)


# --- the dataset view ---------------------------------------------------------------------------
def test_grpo_view_carries_the_value_table_and_class_weights(data: Path) -> None:
    from train.common.grpo_data import load_grpo_datasets
    from train.grpo import GRPOScriptArguments

    train, val, fingerprints, types = load_grpo_datasets(GRPOScriptArguments(data=str(data)), need_eval=True)
    assert types == ["review", "locate"] and set(fingerprints) == {
        f"{n}/{s}" for n in ("review_sft", "locate_sft") for s in ("train", "validation")
    }
    assert set(train.column_names) == {
        "prompt",
        "decision",
        "label",
        "weight",
        "values",
        "values_implied",
        "v_now",
        "best_value",
        "choices",
        "segments",
        "opening",
        "job",
        "review_index",
    }
    weights = {(r["decision"], r["label"]): r["weight"] for ds in (train, val) for r in ds}
    # train: 6 continue, 2 recover -> n / (k * n_c); validation rows get the train split's weights
    assert weights == {
        ("review", "continue"): pytest.approx(8 / 12),
        ("review", "recover"): pytest.approx(2.0),
        ("locate_fine", "2"): 1.0,
    }
    fine = next(r for r in train if r["decision"] == "locate_fine")
    assert json.loads(fine["values"]) == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.0, "4": 0.0}
    assert fine["values_implied"] and fine["best_value"] == 1.0
    assert json.loads(fine["choices"]) == {"2": [2], "3": [3], "4": [4]}  # the segment the prompt offers
    unweighted, _, _, _ = load_grpo_datasets(GRPOScriptArguments(data=str(data), balance_review=False), False)
    assert set(unweighted["weight"]) == {1.0}


def test_restore_point_rewards_are_weighted_by_stay_or_step_back(tmp_path: Path) -> None:
    """One locate row in four stays at the current checkpoint: GRPO weights its reward up (and the
    step-back rows' down) as SFT resamples them, unless balance_locate is off."""
    from datasets import Dataset, DatasetDict

    from data_gen.scoring.rewards import locate_reward
    from train.common.grpo_data import load_grpo_datasets
    from train.grpo import GRPOScriptArguments

    rows = []
    for i in range(8):
        row = sft_row("locate_fine", i)
        row["meta"] = {**row["meta"], "step": 4, "restore": 4 if i % 4 == 0 else 2}
        rows.append(row)
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "locate_sft"))
    train, _, _, _ = load_grpo_datasets(GRPOScriptArguments(data=str(tmp_path), decision_types=["locate"]), False)
    assert sorted(train["weight"]) == pytest.approx([8 / 12] * 6 + [2.0] * 2)
    row = next(r for r in train if r["weight"] == pytest.approx(2.0))
    cols = {k: [row[k]] for k in ("decision", "values", "choices", "weight")}
    answer = dump("locate_fine", 2)  # type: ignore[arg-type]
    assert locate_reward([answer], **cols, lateness=0.0) == [pytest.approx(2.0)]  # V(2) = 1, stay weight 2
    flat, _, _, _ = load_grpo_datasets(
        GRPOScriptArguments(data=str(tmp_path), decision_types=["locate"], balance_locate=False), False
    )
    assert set(flat["weight"]) == {1.0}


def test_prefilled_prompts_end_with_the_answer_opening_the_ranker_scores(data: Path) -> None:
    """A prefilled prompt is the chat text the ranking controller scores after, then the opening of
    each of its candidate answers; the rewards read the sampled decision after that opening."""
    from data_gen.scoring.rewards import locate_reward, review_reward
    from rir_runtime.controllers import candidates
    from rir_runtime.llm.tiny import build_tokenizer
    from train.common.grpo_data import load_grpo_datasets, prefill_answers
    from train.grpo import GRPOScriptArguments

    tokenizer = build_tokenizer()
    train, _, _, _ = load_grpo_datasets(GRPOScriptArguments(data=str(data)), need_eval=False)
    assert set(train["opening"]) == {""}
    prefilled = prefill_answers(train, tokenizer)
    for chat, row in zip(train, prefilled, strict=True):
        head = tokenizer.apply_chat_template(chat["prompt"], tokenize=False, add_generation_prompt=True)
        assert row["prompt"] == head + row["opening"]
        ranked = candidates(row["decision"], context(0, row["decision"]))
        assert ranked and all(text.startswith(row["opening"]) for text, _ in ranked)
        target = dump(row["decision"], Review("recover", "x") if row["decision"] == "review" else 2)
        assert target.startswith(row["opening"])  # the SFT target opens the same way

    review = next(r for r in prefilled if r["decision"] == "review")
    cols = {k: [review[k]] * 3 for k in ("decision", "label", "weight", "opening")}
    wrong = "continue" if review["label"] == "recover" else "recover"
    cut = f'{review["label"]}", "reason": "cut short'
    assert review_reward([cut, f'{wrong}"', "maybe"], **cols) == [review["weight"], 0.0, 0.0]
    fine = next(r for r in prefilled if r["decision"] == "locate_fine")
    cols = {k: [fine[k]] * 2 for k in ("decision", "values", "choices", "opening")}
    assert locate_reward(["2}", "9}"], **cols, lateness=0.0) == [1.0, 0.0]  # 9 is not offered


def test_grpo_script_arguments_are_checked() -> None:
    from train.grpo import GRPOScriptArguments

    with pytest.raises(UserInputError, match=r"\['reflect'\] have no value table.*rir train sft\|dpo"):
        GRPOScriptArguments(decision_types=["review", "reflect"])
    with pytest.raises(UserInputError, match="lateness_penalty 1.0 must be within"):
        GRPOScriptArguments(lateness_penalty=1.0)
    with pytest.raises(UserInputError, match="hard_points screens a value adapter.*--value_adapter"):
        GRPOScriptArguments(hard_points="table")
    with pytest.raises(UserInputError, match="--hard_points online plays the options out.*--reward online"):
        GRPOScriptArguments(hard_points="online", value_adapter="runs/value-where")
    with pytest.raises(UserInputError, match="reward_draws 2: a whole number >= 0, with --reward online"):
        GRPOScriptArguments(reward_draws=2)
    assert GRPOScriptArguments(sft_adapter="null").sft_adapter is None


def test_rows_without_value_meta_are_a_clear_error(data: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    from train.common.grpo_data import load_grpo_datasets
    from train.grpo import GRPOScriptArguments

    dd = load_from_disk(str(data / "review_sft"))
    dd.map(lambda r: {"meta": {k: v for k, v in r["meta"].items() if k != "values"}}).save_to_disk(
        str(tmp_path / "review_sft")
    )
    with pytest.raises(UserInputError, match=r"lack meta \['values'\].*rebuild"):
        load_grpo_datasets(GRPOScriptArguments(data=str(tmp_path / "review_sft")), need_eval=False)


# --- the smoke run --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_adapter(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SFT adapter whose samples are mostly parseable answers (80 short steps)."""
    from train import sft

    out = tmp_path_factory.mktemp("sft") / "adapter"
    args = parse(
        "sft",
        [
            "--config",
            str(REPO / "configs/train/sft_cpu_quick.yaml"),
            *FAST,
            "--data",
            str(data),
            "--decision_types",
            "review",
            "locate",
            "--output-dir",
            str(out),
            "--max-steps",
            "80",
            "--learning_rate",
            "1e-2",
            "--lr_scheduler_type",
            "cosine",
            "--per_device_train_batch_size",
            "4",
            "--lora_r",
            "16",
            "--lora_alpha",
            "32",
            "--lora_dropout",
            "0",
            "--logging_steps",
            "40",
            "--calibrate_review",
            "false",
        ],
    )
    sft.main(*args)
    return out


@pytest.fixture(scope="module")
def grpo_run(data: Path, sft_adapter: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two GRPO steps of 2 prompts x 4 samples from the SFT adapter."""
    from train import grpo

    out = tmp_path_factory.mktemp("grpo") / "adapter"
    args = parse(
        "grpo",
        [
            "--config",
            str(REPO / "configs/train/grpo_cpu_quick.yaml"),
            *FAST,
            "--data",
            str(data),
            "--sft_adapter",
            str(sft_adapter),
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--learning_rate",
            "1e-3",
        ],
    )
    trainer = grpo.main(*args)
    return out, trainer


def test_grpo_logs_rewards_and_writes_a_grpo_card(grpo_run, sft_adapter: Path) -> None:
    out, trainer = grpo_run
    steps = [e for e in trainer.state.log_history if "reward" in e]
    assert len(steps) == 2
    for key in ("reward", "rewards/review_reward/mean", "rewards/locate_reward/mean", "frac_reward_zero_std"):
        assert key in steps[0], key
    assert max(e["reward_std"] for e in steps) > 0  # rewards that never vary would give no advantage
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["kind"] == "controller" and card["stage"] == "grpo" and card["sft_adapter"] == str(sft_adapter)
    assert card["decision_types"] == ["review", "locate"]
    assert card["values"]["rows"] == 16 and card["values"]["rows_with_implied_values"] == 16
    assert "bisection" in card["values"]["implied_by"]
    assert not (out / "ref").exists()
    state = json.loads((out / "trainer_state.json").read_text())
    assert [e["reward"] for e in state["log_history"] if "reward" in e] == [e["reward"] for e in steps]


def test_grpo_trains_the_sft_adapters_lora_only(grpo_run, sft_adapter: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, trainer = grpo_run
    card = json.loads((out / "rir_controller.json").read_text())
    base = dict(AutoModelForCausalLM.from_pretrained(card["base_model_path"]).named_parameters())
    start = {k.replace(".weight", ""): v for k, v in load_file(str(sft_adapter / "adapter_model.safetensors")).items()}
    moved = 0
    for name, param in trainer.model.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "").replace(".weight", "")
            moved += int(not torch.equal(param.detach().cpu(), start[key]))
        else:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(param.detach().cpu(), base[key].detach()), f"base weight {key} changed"
    assert moved > 0


def test_grpo_adapter_serves_as_a_tuned_controller(grpo_run) -> None:
    from rir_runtime.controllers import make_controller

    out, _ = grpo_run
    controller = make_controller(f"tuned:{out}")
    decision = controller.review(context(0, "review"))
    assert isinstance(decision.value, Review) and decision.value.decision in ("recover", "continue")
    assert controller.locate_fine(context(0, "locate_fine")).value in (2, 3, 4)


# --- every shipped GRPO config -------------------------------------------------------------------------
@pytest.mark.parametrize("config", GRPO_CONFIGS, ids=[c.stem for c in GRPO_CONFIGS])
def test_shipped_grpo_config_builds_and_trains_one_step(config: Path, data: Path, tmp_path: Path) -> None:
    """GPU configs too, on the tiny model on CPU, from the base model (a fresh LoRA adapter)."""
    from train import grpo

    args = parse(
        "grpo",
        [
            "--config",
            str(config),
            *FAST,
            "--sft_adapter",
            "null",
            "--data",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "1",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--num_generations",
            "2",
            "--max_completion_length",
            "8",
            "--max_train_samples",
            "4",
        ],
    )
    trainer, card = grpo.build_trainer(*args)
    trainer.train()
    assert trainer.state.global_step == 1 and card["stage"] == "grpo" and card["extra"]["sft_adapter"] is None
    assert any("rewards/locate_reward/mean" in e for e in trainer.state.log_history)


# --- the command ----------------------------------------------------------------------------------
def test_rir_train_grpo_parses_with_the_grpo_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import train.commands.train as cli

    parser = argparse.ArgumentParser(prog="rir")
    cli.add_parser(parser.add_subparsers(dest="command"), "train", "")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("num_generation: 4\n")
    with pytest.raises(UserInputError, match="Did you mean 'num_generations'"):
        cli.cmd_train(parser.parse_args(["train", "grpo", "--config", str(cfg)]))
    launched: list[list[str]] = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: launched.append(cmd) or 0)
    assert cli.cmd_train(parser.parse_args(["train", "grpo", "--launcher", "accelerate", "--max-steps", "3"])) == 0
    cmd = launched[0]
    assert cmd[cmd.index("-m", cmd.index("--config_file")) + 1] == "train.grpo" and cmd[-2:] == ["--max-steps", "3"]


def test_grpo_warns_once_when_no_group_has_reward_variance(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from train.common.grpo_common import NoSignalWarning

    args = SimpleNamespace(temperature=0.5, num_generations=4)
    main, other = SimpleNamespace(is_world_process_zero=True), SimpleNamespace(is_world_process_zero=False)
    callback, on_other_process = NoSignalWarning(patience=3), NoSignalWarning(patience=3)
    for flat in (1.0, 1.0, 0.5, 1.0, 1.0):  # a step with signal resets the count
        callback.on_log(args, main, None, logs={"frac_reward_zero_std": flat})
    assert "not learning" not in capsys.readouterr().out
    for flat in (1.0, 1.0):
        callback.on_log(args, main, None, logs={"frac_reward_zero_std": flat, "loss": 0.0})
    callback.on_log(args, main, None, logs={"loss": 0.0})  # an eval or other log line changes nothing
    for _ in range(4):
        on_other_process.on_log(args, other, None, logs={"frac_reward_zero_std": 1.0})
    out = capsys.readouterr().out
    assert out.count("GRPO is not learning") == 1
    assert "last 3 logged steps" in out and "temperature 0.5" in out and "--num_generations" in out
