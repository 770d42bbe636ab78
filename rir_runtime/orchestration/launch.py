"""Training runs as subprocesses through each stage's own entry point (`python -m train.<stage>`, or the
same under `accelerate launch`), resumed from the newest complete checkpoint after a kill.

Under accelerate, one argument list holds two parsers' flags: accelerate's own (`--num_processes`,
`--mixed_precision`, `--main_process_port`, ... as `accelerate launch --help` lists them) go to
`accelerate launch`, the rest to the stage. The process count comes from `--num_processes`, else the
accelerate config, else the machine (one process per GPU), so a shipped config fits any machine.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rir_runtime.errors import RIRError, UserInputError

LAUNCHERS = ("python", "accelerate")  # how a training process starts: plainly, or under `accelerate launch`
SINGLE_PROCESS_CONFIG = "configs/accelerate/single_gpu.yaml"  # the accelerate config used when none is named
MULTI_PROCESS_CONFIG = "configs/accelerate/multi_gpu.yaml"  # DDP through torchrun: GPUs, or CPUs over gloo
# Flags both parsers know stay with the stage: the Trainer's gradient accumulation (it also fills DeepSpeed's),
# TrainingArguments' `--debug`, and `-h` (the stage's help lists every training key).
STAGE_FLAGS = frozenset({"gradient_accumulation_steps", "debug", "help"})
RIR_SETS = frozenset({"module", "no_python"})  # the launch command runs the stage's module itself
ONE_PROCESS_KINDS = ("NO", "MULTI_CPU")  # accelerate's simple launcher: one process unless mpirun starts them


def train_command(module: str, args: list[str], launcher: str = "python", accelerate_config: str = "") -> list[str]:
    """`python -m <module> <args>`, or the same under `accelerate launch` (see `accelerate_command`)."""
    check_launcher(launcher)
    if launcher == "accelerate":
        return accelerate_command(module, args, accelerate_config or None)
    return [sys.executable, "-m", module, *args]


def check_launcher(launcher: str, name: str = "launcher") -> None:
    """Refuse a launcher that is neither `python` nor `accelerate` (`name`: as the user spelt the setting)."""
    if launcher not in LAUNCHERS:
        raise UserInputError(f"{name} '{launcher}' unknown: choose {' or '.join(LAUNCHERS)}")


def run_training(what: str, cmd: list[str], label: str = "pipeline") -> None:
    """Run a training command; a failure stops the caller, and a rerun resumes from the last checkpoint."""
    print(f"[{label}] $ {shlex.join(cmd)}", file=sys.stderr)
    if subprocess.run(cmd).returncode != 0:
        raise RIRError(f"{what} failed (see the log above); rerun the same command to resume from its last checkpoint")


def last_complete_checkpoint(folder: Path) -> Path | None:
    """The newest `checkpoint-N` in `folder` whose trainer state was saved whole. The Trainer writes that
    file last (and not atomically), so a checkpoint without it, or with it cut short, is one a kill
    interrupted, and resuming from it would fail."""
    steps = {
        int(m.group(1)): p
        for p in folder.glob("checkpoint-*")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and _whole_state(p / "trainer_state.json")
    }
    return steps[max(steps)] if steps else None


def _whole_state(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, UnicodeDecodeError, ValueError):
        return False


# --- accelerate launch --------------------------------------------------------------------------
@dataclass(frozen=True)
class AccelerateLaunch:
    """One `accelerate launch`: its config file, its own flags (name -> value, None for a switch), and
    the arguments of the stage it runs."""

    config_file: str
    flags: tuple[tuple[str, str | None], ...]
    stage_args: tuple[str, ...]

    def command(self, module: str) -> list[str]:
        own = [part for name, value in self.flags for part in (f"--{name}", value) if part is not None]
        head = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", self.config_file]
        return [*head, *own, "-m", module, *self.stage_args]


def accelerate_command(module: str, argv: Sequence[str], config_file: str | None = None) -> list[str]:
    """`accelerate launch ... -m <module> <stage args>` for a mixed argument list (`plan_accelerate_launch`)."""
    return plan_accelerate_launch(argv, config_file).command(module)


@functools.cache
def accelerate_flags() -> dict[str, bool]:
    """{flag in underscore spelling: takes a value} of `accelerate launch`, read from its parser so the list
    follows the installed accelerate; without the flags the stage keeps (STAGE_FLAGS) or rir sets (RIR_SETS)."""
    from accelerate.commands.launch import launch_command_parser  # type: ignore[import-untyped]

    flags = {
        opt[2:].replace("-", "_"): action.nargs != 0
        for action in launch_command_parser()._actions
        for opt in action.option_strings
        if opt.startswith("--")
    }
    return {name: takes for name, takes in flags.items() if name not in STAGE_FLAGS | RIR_SETS}


def split_accelerate_args(argv: Sequence[str]) -> tuple[dict[str, str | None], list[str]]:
    """(accelerate's flags as {name: value or None}, the stage's arguments). accelerate takes either
    spelling (`--num-processes=2`, `--num_processes 2`); the launch command gets the underscore one."""
    known = accelerate_flags()
    flags: dict[str, str | None] = {}
    stage: list[str] = []
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        name = key[2:].replace("-", "_") if key.startswith("--") else ""
        if name not in known:
            stage.append(arg)
        elif not known[name]:
            if eq:
                raise UserInputError(f"accelerate's {key} is a switch: pass it without a value")
            flags[name] = None
        else:
            value = value if eq else next(it, "")
            if not value or value.startswith("--"):
                raise UserInputError(f"accelerate's {key} needs a value, e.g. {key} 2")
            flags[name] = value
    return flags, stage


def plan_accelerate_launch(argv: Sequence[str], config_file: str | None = None) -> AccelerateLaunch:
    """Split the arguments, choose the config (a multi-process one when more than one process is asked
    for), take the process count from the flags, the config or the machine, and make `--cpu` start N
    processes (accelerate's CPU launcher starts one unless mpirun is used)."""
    flags, stage_args = split_accelerate_args(argv)
    if "config_file" in flags:
        if config_file:
            raise UserInputError("--accelerate-config and --config_file both name an accelerate config: pass one")
        config_file = flags.pop("config_file")
    given = _int_flag(flags, "num_processes")
    config_file = config_file or (MULTI_PROCESS_CONFIG if (given or 1) > 1 else SINGLE_PROCESS_CONFIG)
    config = read_accelerate_config(config_file)
    kind = str(config.get("distributed_type", "NO"))
    if given is None and "num_processes" not in config and kind != "NO":
        machines = _int_flag(flags, "num_machines") or int(config.get("num_machines") or 1)
        flags["num_processes"] = str(machine_processes() * machines)
    count = _int_flag(flags, "num_processes") or int(config.get("num_processes") or 1)
    mpirun = "mpirun_hostfile" in flags or bool((config.get("mpirun_config") or {}).get("mpirun_hostfile"))
    if count > 1 and not mpirun and ("cpu" in flags or kind == "MULTI_CPU"):
        # torchrun starts the N processes; `--use_cpu true` makes each a CPU rank (gloo), as --cpu would.
        flags.pop("cpu", None)
        flags["multi_gpu"] = None
        stage_args += ["--use_cpu", "true"]
    launchers = {"multi_gpu", "use_fsdp", "use_deepspeed", "use_megatron_lm"}
    if count > 1 and kind in ONE_PROCESS_KINDS and not mpirun and not launchers & set(flags):
        raise UserInputError(
            f"accelerate config {config_file} (distributed_type {kind}) starts one process, but {count} were "
            f"asked for: pass --accelerate-config {MULTI_PROCESS_CONFIG} (or fsdp.yaml / deepspeed_zero2.yaml), "
            "or drop --num_processes"
        )
    return AccelerateLaunch(config_file, tuple(flags.items()), tuple(stage_args))


def read_accelerate_config(path: str) -> dict:
    from rir_runtime.orchestration.config import load_yaml

    if not Path(path).is_file():
        raise UserInputError(
            f"accelerate config {path} does not exist: pass --accelerate-config "
            "configs/accelerate/<single_gpu|multi_gpu|fsdp|deepspeed_zero2>.yaml (run from the repository root)"
        )
    return load_yaml(path)


def machine_processes() -> int:
    """One process per visible GPU; one on a machine without GPUs."""
    import torch

    return max(torch.cuda.device_count(), 1)


def _int_flag(flags: dict[str, str | None], name: str) -> int | None:
    value = flags.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserInputError(f"--{name} {value}: pass a whole number of at least 1")
    return int(value)
