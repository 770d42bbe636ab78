"""`rir train ... --launcher accelerate`: accelerate's flags reach `accelerate launch`, the shipped configs
leave the process count and the precision to the run, and the launched processes check how they were
launched. The integration test trains on two CPU processes (gloo) and on one, at the same global batch.

Commands are checked the way accelerate reads them: parsed by its launch parser and resolved against the
config by its own validation, without starting anything.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

pytest.importorskip("accelerate")

from rir_runtime.errors import UserInputError  # noqa: E402
from rir_runtime.orchestration import launch  # noqa: E402
from tests.training import write_data

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs" / "accelerate").glob("*.yaml"))


def accelerate_reads(cmd: list[str]) -> SimpleNamespace:
    """accelerate's own view of a launch command: parsed, then resolved against its config file."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    return args


def launched_env(argv: list[str], config: str | None = None) -> dict[str, str]:
    """The environment accelerate's multi-process launcher gives each process for these arguments."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    env = prepare_multi_gpu_env(accelerate_reads(launch.accelerate_command("train.sft", argv, config)))
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "machine_processes", lambda: 4)


# --- the command ----------------------------------------------------------------------------------
def test_cli_passes_accelerate_flags_to_accelerate_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import train.commands.train as cli

    launched: list[list[str]] = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: launched.append(cmd) or 0)
    parser = argparse.ArgumentParser(prog="rir")
    cli.add_parser(parser.add_subparsers(dest="command"), "train", "")
    argv = ["train", "sft", "--launcher", "accelerate", "--num_processes", "2", "--mixed-precision=bf16"]
    argv += ["--main_process_port", "29612", "--config", "c.yaml", "--max-steps", "3"]
    argv += ["--gradient_accumulation_steps", "2"]  # the Trainer's: both parsers know it
    assert cli.cmd_train(parser.parse_args(argv)) == 0
    args = accelerate_reads(launched[0])
    assert (args.num_processes, args.mixed_precision, args.main_process_port) == (2, "bf16", 29612)
    assert args.multi_gpu and args.config_file == launch.MULTI_PROCESS_CONFIG  # 2 processes: DDP
    assert args.module and args.training_script == "train.sft"
    assert args.training_script_args == ["--config", "c.yaml", "--max-steps", "3", "--gradient_accumulation_steps", "2"]


def test_flags_both_parsers_know_stay_with_the_stage() -> None:
    from train import dpo, sft

    accelerate = set(launch.accelerate_flags())
    for module in (sft, dpo):
        parser = module.make_parser()
        stage = {o[2:].replace("-", "_") for a in parser._actions for o in a.option_strings if o.startswith("--")}
        assert not accelerate & stage, f"{module.__name__} also knows {sorted(accelerate & stage)}"
    assert {"num_processes", "mixed_precision", "num_machines", "main_process_port", "cpu"} <= accelerate


def test_split_takes_either_spelling_and_rejects_a_missing_value() -> None:
    flags, stage = launch.split_accelerate_args(["--num-processes=2", "--same_network", "--out", "x", "-h"])
    assert flags == {"num_processes": "2", "same_network": None} and stage == ["--out", "x", "-h"]
    with pytest.raises(UserInputError, match="--num_processes needs a value"):
        launch.split_accelerate_args(["--num_processes", "--max-steps", "3"])
    with pytest.raises(UserInputError, match="both name an accelerate config"):
        launch.plan_accelerate_launch(["--config_file", str(CONFIGS[0])], str(CONFIGS[1]))


# --- the shipped configs --------------------------------------------------------------------------
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_configs_leave_process_count_and_precision_to_the_run(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    assert "mixed_precision" not in config, "the train config's bf16/fp16 decides the precision"
    if config["distributed_type"] != "NO":
        assert "num_processes" not in config, "the process count comes from --num_processes or the machine"
    if config["distributed_type"] == "FSDP":
        assert config["fsdp_config"]["fsdp_activation_checkpointing"] is True


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_process_count_comes_from_the_flag_else_the_machine(path: Path, four_gpus: None) -> None:
    one = yaml.safe_load(path.read_text())["distributed_type"] == "NO"
    machine = accelerate_reads(launch.accelerate_command("train.sft", [], str(path)))
    assert machine.num_processes == (1 if one else 4)
    assert machine.mixed_precision == "no"
    if not one:
        flag = accelerate_reads(launch.accelerate_command("train.sft", ["--num_processes", "2"], str(path)))
        assert flag.num_processes == 2


def test_more_processes_than_a_one_process_config_is_an_error() -> None:
    single = str(REPO / launch.SINGLE_PROCESS_CONFIG)
    with pytest.raises(UserInputError, match="starts one process, but 2 were asked for.*multi_gpu.yaml"):
        launch.plan_accelerate_launch(["--num_processes", "2"], single)
    assert launch.plan_accelerate_launch([]).config_file == launch.SINGLE_PROCESS_CONFIG


def test_cpu_processes_start_through_torchrun_as_cpu_ranks() -> None:
    """accelerate's --cpu launcher starts one process unless mpirun starts them; torchrun starts N."""
    args = accelerate_reads(launch.accelerate_command("train.sft", ["--num_processes", "2", "--cpu", "--x", "1"]))
    assert args.num_processes == 2 and args.multi_gpu and not args.cpu
    assert args.training_script_args == ["--x", "1", "--use_cpu", "true"]
    alone = accelerate_reads(launch.accelerate_command("train.sft", ["--cpu"]))
    assert alone.cpu and alone.num_processes == 1 and alone.training_script_args == []


# --- the launched process -------------------------------------------------------------------------
def _train_args(**kw: object) -> SimpleNamespace:
    fields = dict(bf16=False, fp16=False, activation_checkpointing=False, gradient_checkpointing=False, world_size=1)
    return SimpleNamespace(**{**fields, **kw})


def test_launcher_precision_must_match_the_train_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from train.common.distributed import check_precision

    for key, value in launched_env(["--num_processes", "2", "--mixed_precision", "bf16"]).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserInputError, match="mixed_precision bf16.*fp32.*drop --mixed_precision.*bf16: true"):
        check_precision(_train_args(bf16=False))
    check_precision(_train_args(bf16=True))
    for key, value in launched_env(["--num_processes", "2"]).items():  # the shipped config: no precision
        monkeypatch.setenv(key, value)
    check_precision(_train_args(bf16=False))
    check_precision(_train_args(fp16=True))


def test_fsdp_replaces_the_trainers_gradient_checkpointing(monkeypatch: pytest.MonkeyPatch) -> None:
    from train.common.distributed import use_fsdp_checkpointing

    fsdp = str(REPO / "configs/accelerate/fsdp.yaml")
    for key, value in launched_env(["--num_processes", "2"], fsdp).items():
        monkeypatch.setenv(key, value)
    args = _train_args(activation_checkpointing=True, gradient_checkpointing=True)
    use_fsdp_checkpointing(args)
    assert not args.activation_checkpointing and not args.gradient_checkpointing
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "false")
    kept = _train_args(gradient_checkpointing=True)
    use_fsdp_checkpointing(kept)
    assert kept.gradient_checkpointing


def test_launched_processes_that_do_not_join_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from train.common.distributed import check_process_group

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserInputError, match="2 processes were launched.*pass --cpu.*use_cpu: true"):
        check_process_group(_train_args(world_size=1))
    check_process_group(_train_args(world_size=2))


def test_end_training_frees_the_ddp_wrapper_before_the_process_group() -> None:
    """Freed after the group, the wrapper's reducer destroys the group holding the GIL (a hang at exit)."""
    import torch
    import torch.distributed as dist

    from train.common.distributed import end_training

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 2)
        freed_at_end: list[bool] = []

        class Trainer:  # what end_training uses of a transformers Trainer
            def __init__(self) -> None:
                self.model, self.model_wrapped = model, torch.nn.parallel.DistributedDataParallel(model)
                self.accelerator = SimpleNamespace(free_memory=lambda: None)

            def end(self) -> None:
                freed_at_end.append(wrapper() is None)
                dist.destroy_process_group()

        trainer = Trainer()
        wrapper = weakref.ref(trainer.model_wrapped)
        end_training(trainer)
        assert freed_at_end == [True] and trainer.model_wrapped is model
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --- a real two-process run -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(out: Path, steps: int) -> tuple[dict[int, float], float]:
    """({step: logged loss}, last epoch) from the last checkpoint's trainer state."""
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    logs = [e for e in state["log_history"] if "loss" in e]
    return {e["step"]: e["loss"] for e in logs}, logs[-1]["epoch"]


@pytest.mark.integration
def test_two_cpu_processes_match_one_at_the_same_global_batch(tmp_path: Path) -> None:
    """LoRA SFT of tiny-random-llama: 2 gloo processes x 2 rows against 1 process x 4 rows, per-step loss.
    Two decision types whose completions differ in length, so the token-mean loss must average across
    processes by tokens, not by process."""

    data = write_data(tmp_path / "data", n_train=8, n_val=2)
    steps = 4  # 16 train rows at a global batch of 4: one epoch
    common = ["--config", "configs/train/sft_cpu_quick.yaml", "--model", "tiny-random-llama", "--data", str(data)]
    common += ["--decision_types", "locate", "reflect", "--dtype", "float32", "--max_steps", str(steps)]
    common += ["--learning_rate", "5e-2", "--lora_dropout", "0", "--eval_strategy", "no", "--eval_on_start", "false"]
    common += ["--save_strategy", "steps", "--save_steps", str(steps), "--logging_steps", "1"]
    common += ["--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0"]
    rir = [sys.executable, "-m", "rir_runtime.cli", "train", "sft"]
    runs = {
        1: [*rir, *common, "--per_device_train_batch_size", "4"],
        2: [*rir, "--launcher", "accelerate", "--num_processes", "2", "--cpu", "--main_process_port"]
        + [str(_free_port()), *common, "--per_device_train_batch_size", "2"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    curves = {}
    for n, cmd in runs.items():
        out = tmp_path / f"procs{n}"
        done = subprocess.run([*cmd, "--output_dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{n} process(es): {done.stderr[-3000:]}"
        curves[n] = _losses(out, steps)
        print(f"{n} process(es): " + ", ".join(f"{s}: {v:.6f}" for s, v in sorted(curves[n][0].items())))
    (one, one_epoch), (two, two_epoch) = curves[1], curves[2]
    assert one_epoch == two_epoch == 1.0  # the two processes each took half of every global batch
    assert sorted(one) == sorted(two) == list(range(1, steps + 1))
    assert one[steps] < one[1] - 0.5  # it trained: the curves compared are not flat
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), f"step {step}: {two[step]} vs {one[step]}"
