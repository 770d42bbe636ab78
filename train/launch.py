"""Training runs as subprocesses through each stage's own entry point (`python -m train.<stage>`, or the
same under `accelerate launch`), resumed from the newest complete checkpoint after a kill.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from rir_runtime.errors import RIRError, UserInputError


def train_command(module: str, args: list[str], launcher: str = "python", accelerate_config: str = "") -> list[str]:
    """`python -m <module> <args>`, or the same under `accelerate launch --config_file <accelerate_config>`."""
    if launcher not in ("python", "accelerate"):
        raise UserInputError(f"launcher '{launcher}' unknown: choose python or accelerate")
    head = [sys.executable, "-m"]
    if launcher == "accelerate":
        head += ["accelerate.commands.launch", "--config_file", accelerate_config, "-m"]
    return [*head, module, *args]


def run_training(what: str, cmd: list[str], label: str = "pipeline") -> None:
    """Run a training command; a failure stops the caller, and a rerun resumes from the last checkpoint."""
    print(f"[{label}] $ {shlex.join(cmd)}", file=sys.stderr)
    if subprocess.run(cmd).returncode != 0:
        raise RIRError(f"{what} failed (see the log above); rerun the same command to resume from its last checkpoint")


def last_complete_checkpoint(folder: Path) -> Path | None:
    """The newest `checkpoint-N` in `folder` whose trainer state was saved. The Trainer writes that file
    last, so a checkpoint without it is one a kill interrupted, and resuming from it would fail."""
    steps = {
        int(m.group(1)): p
        for p in folder.glob("checkpoint-*")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").is_file()
    }
    return steps[max(steps)] if steps else None
