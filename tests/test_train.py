"""Training: SFT and DPO of LoRA controller adapters on the tiny random Llama (built from a config).

Datasets are written in the test, in the exact format `rir build-data` writes (TRL conversational
prompt-completion and preference rows, `train`/`validation` splits, a `meta` column).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rir_runtime.errors import UserInputError  # noqa: E402
from rir_runtime.prompts import PROMPT_FORMAT_VERSION  # noqa: E402
from tests.training import ANSWERS, FAST, PROMPT_BUDGET, REPO, decision_prompt, parse, write_data  # noqa: E402

# GRPO configs take other keys (num_generations, ...): tests/test_grpo.py trains each of them
# GRPO and value configs train other models (tests/test_grpo.py, tests/test_value_controller.py)
TRAIN_CONFIGS = sorted(
    c for c in (REPO / "configs" / "train").glob("*.yaml") if not c.name.startswith(("grpo_", "value_"))
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A 2-core box shared with other jobs: one BLAS thread is many times faster than two fighting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data"))


# --- SFT --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_run(data: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two SFT steps at a high learning rate (LoRA B starts at zero), a checkpoint after each."""
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
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
            "--learning_rate",
            "5e-2",
            "--per_device_train_batch_size",
            "4",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "2",
            "--save_strategy",
            "steps",
            "--save_steps",
            "1",
            "--lora_dropout",
            "0",
        ],
    )
    trainer = sft.main(*args)
    return out, trainer


def test_sft_writes_adapter_with_card(sft_run) -> None:
    out, trainer = sft_run
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["kind"] == "controller" and card["stage"] == "sft"
    assert card["base_model"] == "tiny-random-llama" and Path(card["base_model_path"]).is_dir()
    assert card["decision_types"] == ["review", "locate", "reflect"]
    assert card["prompt_format_version"] == PROMPT_FORMAT_VERSION
    assert set(card["dataset_fingerprints"]) == {f"{t}_sft/{s}" for t in ANSWERS for s in ("train", "validation")}
    assert {"trl", "peft", "transformers", "torch"} <= set(card["trained_with"])
    assert card["max_prompt_tokens"] == PROMPT_BUDGET
    for f in ("adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json", "rir_train_config.json"):
        assert (out / f).is_file(), f
    logs = trainer.state.log_history
    assert any("loss" in e for e in logs) and any("eval_loss" in e for e in logs)


def test_sft_trains_lora_only_and_changes_outputs(sft_run) -> None:
    from transformers import AutoModelForCausalLM

    from rir_runtime.llm import load_transformers_backend
    from rir_runtime.llm.tuned import load_tuned_backend

    out, trainer = sft_run
    card = json.loads((out / "rir_controller.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(card["base_model_path"])
    base_params = dict(base.named_parameters())
    lora_b = 0
    for name, param in trainer.model.named_parameters():
        if "lora_B" in name:
            lora_b += int(param.abs().sum() > 0)  # zero at init: nonzero means trained
        elif "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(param.detach().cpu(), base_params[key].detach()), f"base weight {key} changed"
    assert lora_b > 0

    messages = decision_prompt("review", 0)
    answer = ANSWERS["review"][1]
    tuned = load_tuned_backend(str(out), merge=False, device="cpu")
    plain = load_transformers_backend("tiny-random-llama")
    assert tuned.score(messages, [answer])[0] > plain.score(messages, [answer])[0] + 1.0
    merged = load_tuned_backend(str(out), merge=True, device="cpu")
    assert merged.score(messages, [answer])[0] == pytest.approx(tuned.score(messages, [answer])[0], abs=1e-2)
    assert isinstance(tuned.generate([messages], max_new_tokens=4)[0].text, str)


def test_sft_resumes_from_last_checkpoint(sft_run, tmp_path: Path) -> None:
    from transformers import TrainerCallback

    from train import sft
    from train.common.crashes import last_checkpoint

    src, _ = sft_run
    out = tmp_path / "adapter"
    shutil.copytree(src, out)
    shutil.rmtree(out / "checkpoint-2")  # as if killed after the first save
    args = parse(
        "sft",
        [
            "--config",
            str(REPO / "configs/train/sft_cpu_quick.yaml"),
            *FAST,
            "--data",
            _data_of(src),
            "--output-dir",
            str(out),
            "--max-steps",
            "3",
            "--eval_strategy",
            "no",
        ],
    )
    trainer, _ = sft.build_trainer(*args)
    steps: list[int] = []

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            steps.append(state.global_step)

    trainer.add_callback(Count())
    ckpt = last_checkpoint(args[1])
    assert ckpt is not None and ckpt.endswith("checkpoint-1")
    trainer.train(resume_from_checkpoint=ckpt)
    assert steps == [2, 3] and trainer.state.global_step == 3


def _data_of(adapter: Path) -> str:
    return json.loads((adapter / "rir_train_config.json").read_text())["script"]["data"]


# --- DPO --------------------------------------------------------------------------------------
def test_dpo_continues_the_sft_adapter(sft_run, data: Path, tmp_path: Path) -> None:
    from rir_runtime.llm.tuned import load_tuned_backend
    from train import dpo

    sft_out, _ = sft_run
    out = tmp_path / "dpo"
    args = parse(
        "dpo",
        [
            "--config",
            str(REPO / "configs/train/dpo_cpu_quick.yaml"),
            *FAST,
            "--data",
            str(data),
            "--sft-adapter",
            str(sft_out),
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
            "--learning_rate",
            "1e-2",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "2",
            "--decision_types",
            "review",
            "locate",
        ],
    )
    trainer = dpo.main(*args)
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["stage"] == "dpo" and card["sft_adapter"] == str(sft_out)
    assert card["decision_types"] == ["review", "locate"]
    assert not (out / "ref").exists()  # the frozen reference copy is not saved with the result
    evals = [e for e in trainer.state.log_history if "eval_rewards/accuracies" in e]
    assert evals and any("loss" in e for e in trainer.state.log_history)
    assert "ref" in trainer.model.peft_config  # reference = frozen copy of the SFT adapter
    load_tuned_backend(str(out), device="cpu")


def test_dpo_rejects_an_adapter_of_another_base(sft_run, tmp_path: Path) -> None:
    from train.common.models import check_same_base

    with pytest.raises(UserInputError, match="was trained on base model '/nonexistent/base'"):
        check_same_base({"base_model": "/nonexistent/base"}, "x", "tiny-random-llama", "/tmp")


# --- every shipped config ----------------------------------------------------------------------
@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=[c.stem for c in TRAIN_CONFIGS])
def test_shipped_config_builds_and_trains_one_step(config: Path, data: Path, sft_run, tmp_path: Path) -> None:
    """GPU configs too, on the tiny model on CPU: a typo or an incompatible option fails here."""
    from train import dpo, sft

    stage = "dpo" if config.name.startswith("dpo") else "sft"
    extra = ["--sft-adapter", str(sft_run[0])] if stage == "dpo" else []
    if config.name.startswith("agent"):  # the agent's trainer is the same; feed it the controller rows here
        extra += ["--decision_types", "review"]
    args = parse(
        stage,
        [
            "--config",
            str(config),
            *FAST,
            *extra,
            "--data",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "1",
            "--eval_strategy",
            "no",
            "--per_device_train_batch_size",
            "2",
            "--gradient_accumulation_steps",
            "1",
            "--max_train_samples",
            "4",
        ],
    )
    trainer, card = (sft if stage == "sft" else dpo).build_trainer(*args)
    trainer.train()
    assert trainer.state.global_step == 1 and card["stage"] == stage


# --- errors -----------------------------------------------------------------------------------
def test_unknown_config_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: tiny-random-llama\nlearning_rat: 1.0e-4\n")
    with pytest.raises(UserInputError, match="unknown key 'learning_rat'.*Did you mean 'learning_rate'"):
        parse("sft", ["--config", str(cfg)])
    with pytest.raises(UserInputError, match="unknown key 'max_stepz'.*Did you mean 'max_steps'"):
        parse("sft", ["--max_stepz", "3"])
    script, training, _ = parse(
        "sft",
        [
            "--config",
            str(REPO / "configs/train/sft_cpu_quick.yaml"),
            "--output-dir",
            "x",
            "--max-steps",
            "7",
            "--model",
            "m",
            "--data",
            "d",
        ],
    )
    assert (training.output_dir, training.max_steps, script.model, script.data) == ("x", 7, "m", "d")


@pytest.mark.parametrize(
    "drop, match",
    [
        (("split", "validation"), "has no 'validation' split.*rir build-data"),
        (("column", "completion"), r"lacks column\(s\) \['completion'\]"),
    ],
)
def test_broken_dataset_is_a_clear_error(drop, match, tmp_path: Path) -> None:
    from train.common.args import TrainScriptArguments
    from train.common.data import load_datasets

    root = write_data(tmp_path, n_train=2, n_val=1, drop=drop)
    script = TrainScriptArguments(data=str(root))
    with pytest.raises(UserInputError, match=match) as err:
        load_datasets(script, "sft", need_eval=True)
    assert str(root) in str(err.value)


def test_wrong_dataset_kind_and_missing_folder(data: Path, tmp_path: Path) -> None:
    from train.common.args import TrainScriptArguments
    from train.common.data import load_datasets

    with pytest.raises(UserInputError, match="preference dataset.*rir train dpo"):
        load_datasets(TrainScriptArguments(data=str(data / "review_pref")), "sft", True)
    with pytest.raises(UserInputError, match="no dataset folder"):
        load_datasets(TrainScriptArguments(data=str(tmp_path)), "sft", True)


def test_lora_target_typo_lists_the_linear_layers(data: Path, tmp_path: Path) -> None:
    from train import sft

    args = parse(
        "sft",
        [
            "--config",
            str(REPO / "configs/train/sft_cpu_quick.yaml"),
            *FAST,
            "--data",
            str(data),
            "--output-dir",
            str(tmp_path),
            "--lora_target_modules",
            "q_proj",
            "qkv_proj",
        ],
    )
    with pytest.raises(UserInputError, match=r"\['qkv_proj'\] are not modules.*gate_proj.*q_proj"):
        sft.build_trainer(*args)


def test_every_stage_can_put_its_lora_on_the_top_layers_only(data: Path, tmp_path: Path) -> None:
    from train import sft

    argv = ["--config", str(REPO / "configs/train/sft_cpu_quick.yaml"), *FAST, "--data", str(data),
            "--output-dir", str(tmp_path), "--lora_top_layers", "1"]  # fmt: skip
    trainer, _ = sft.build_trainer(*parse("sft", argv))
    lora = [n for n, _ in trainer.model.named_parameters() if "lora_" in n]
    assert lora and all(".layers.1." in n for n in lora)  # the tiny model's top layer of 2


def test_adapter_card_checks(sft_run, tmp_path: Path) -> None:
    from rir_runtime.llm.card import read_card

    src, _ = sft_run
    bad = tmp_path / "adapter"
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("checkpoint-*"))
    card = json.loads((bad / "rir_controller.json").read_text())
    (bad / "rir_controller.json").write_text(json.dumps({**card, "prompt_format_version": PROMPT_FORMAT_VERSION + 1}))
    with pytest.raises(UserInputError, match=f"version {PROMPT_FORMAT_VERSION + 1}.*version {PROMPT_FORMAT_VERSION}"):
        read_card(bad)
    (bad / "rir_controller.json").write_text(json.dumps({**card, "kind": "policy"}))
    with pytest.raises(UserInputError, match="is a policy adapter.*--policy llm:"):
        read_card(bad)
    (bad / "rir_controller.json").unlink()
    (bad / "adapter_config.json").unlink()  # with it, a plain PEFT adapter loads (tests/test_hub.py)
    with pytest.raises(UserInputError, match="no rir_controller.json"):
        read_card(bad)


def test_a_truncated_adapter_is_named_corrupt_before_any_episode(sft_run, tmp_path: Path) -> None:
    from rir_runtime.controllers import check_controller_name
    from rir_runtime.errors import ModelLoadError
    from rir_runtime.llm.tuned import load_tuned_model

    src, _ = sft_run
    cut = tmp_path / "adapter"
    shutil.copytree(src, cut, ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for load in (lambda: check_controller_name(f"tuned:{cut}"), lambda: load_tuned_model(cut)):
        with pytest.raises(ModelLoadError, match=rf"{weights} is corrupt .*cut short") as err:
            load()
        assert "does not fit" not in str(err.value)


def test_a_run_whose_last_checkpoint_holds_max_steps_saves_it_without_training_further(
    sft_run, data: Path, tmp_path: Path
) -> None:
    """A kill between the last checkpoint and the saved adapter (or a second run into a finished folder):
    the Trainer, resumed from a checkpoint at max_steps, would take one step more."""
    from safetensors.torch import load_file

    from train import sft

    src, _ = sft_run
    out = tmp_path / "adapter"
    out.mkdir()
    shutil.copytree(src / "checkpoint-2", out / "checkpoint-2")  # killed before the adapter was saved
    argv = ["--config", str(REPO / "configs/train/sft_cpu_quick.yaml"), *FAST, "--data", str(data),
            "--output-dir", str(out), "--max-steps", "2", "--save_strategy", "steps", "--save_steps", "1",
            "--eval_strategy", "no"]  # fmt: skip
    trainer = sft.main(*parse("sft", argv))
    assert trainer.state.global_step == 2 and not (out / "checkpoint-3").exists()
    saved, kept = (
        load_file(out / "adapter_model.safetensors"),
        load_file(out / "checkpoint-2" / "adapter_model.safetensors"),
    )
    assert saved.keys() == kept.keys() and all((saved[k] == kept[k]).all() for k in saved)


def test_out_of_memory_says_what_to_reduce() -> None:
    from types import SimpleNamespace

    from train.common.crashes import TrainingResourceError, oom_advice

    args = SimpleNamespace(
        per_device_train_batch_size=8, gradient_accumulation_steps=2, max_length=2048, gradient_checkpointing=False
    )
    with pytest.raises(TrainingResourceError, match="per_device_train_batch_size=8.*effective batch of 16.*max_length"):
        with oom_advice(args):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(RuntimeError, match="other"), oom_advice(args):
        raise RuntimeError("other")


def test_cli_passes_flags_to_the_stage_parser(tmp_path: Path) -> None:
    import argparse

    from train.commands.train import add_parser, cmd_train, split_launcher

    parser = argparse.ArgumentParser(prog="rir")
    add_parser(parser.add_subparsers(dest="command"), "train", "")
    ns = parser.parse_args(["train", "sft", "--config", "c.yaml", "--max-steps", "3", "-h"])
    assert ns.handler is cmd_train and ns.argv == ["--config", "c.yaml", "--max-steps", "3", "-h"]
    assert split_launcher(["--launcher", "accelerate", "--accelerate-config=a.yaml", "--max-steps", "3"]) == (
        "accelerate",
        "a.yaml",
        ["--max-steps", "3"],
    )
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("lora_rr: 8\n")
    with pytest.raises(UserInputError, match="Did you mean 'lora_r'"):
        cmd_train(parser.parse_args(["train", "dpo", "--config", str(cfg)]))


@pytest.mark.parametrize("stage", ["sft", "dpo", "agent-sft"])
def test_accelerate_launcher_runs_an_importable_module(stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--launcher accelerate` relaunches `python -m train.<module>`: agent-sft's module is agent_sft."""
    import argparse
    import importlib.util

    import train.commands.train as cli

    launched: list[list[str]] = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: launched.append(cmd) or 0)
    parser = argparse.ArgumentParser(prog="rir")
    cli.add_parser(parser.add_subparsers(dest="command"), "train", "")
    assert cli.cmd_train(parser.parse_args(["train", stage, "--launcher", "accelerate", "--max-steps", "3"])) == 0
    cmd = launched[0]
    module = cmd[cmd.index("-m", cmd.index("--config_file")) + 1]
    assert importlib.util.find_spec(module) is not None, module
    assert cmd[-2:] == ["--max-steps", "3"]


def test_report_to_tensorboard_writes_event_files(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`report_to: tensorboard` (the `tracking` extra) logs the training loss as TensorBoard events."""
    pytest.importorskip("tensorboard", reason="the tracking extra is not installed: pip install -e '.[tracking]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from train import sft

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    fast = list(FAST)
    fast[fast.index("--report_to") + 1] = "tensorboard"
    out = tmp_path / "adapter"
    args = parse(
        "sft",
        [
            "--config",
            str(REPO / "configs/train/sft_cpu_quick.yaml"),
            *fast,
            "--data",
            str(data),
            "--output-dir",
            str(out),
            "--max-steps",
            "1",
            "--eval_strategy",
            "no",
            "--per_device_train_batch_size",
            "2",
            "--max_train_samples",
            "4",
        ],
    )
    assert args[1].report_to == ["tensorboard"]
    sft.main(*args)
    events = sorted(out.glob("runs/*/events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out}/runs"
    logged = EventAccumulator(str(events[0].parent))
    logged.Reload()
    assert "train/loss" in logged.Tags()["scalars"]


def test_agent_adapters_keep_their_own_prompt_format_version(tmp_path: Path) -> None:
    """A controller prompt change must not retire agent adapters: each kind is checked against its own
    prompt format."""
    from rir_runtime.llm.card import read_card
    from rir_runtime.prompts import AGENT_PROMPT_FORMAT_VERSION

    agent = tmp_path / "agent"
    agent.mkdir()
    card = {
        "kind": "agent",
        "base_model": "smollm2-135m-instruct",
        "prompt_format_version": AGENT_PROMPT_FORMAT_VERSION,
    }
    (agent / "rir_controller.json").write_text(json.dumps(card))
    assert read_card(agent, expect="agent")["prompt_format_version"] == AGENT_PROMPT_FORMAT_VERSION
    (agent / "rir_controller.json").write_text(json.dumps({**card, "prompt_format_version": PROMPT_FORMAT_VERSION + 1}))
    with pytest.raises(UserInputError, match="agent prompts of format version"):
        read_card(agent, expect="agent")
