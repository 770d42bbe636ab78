"""What a training process checks about how it was launched, before it builds its trainer.

`accelerate launch` tells each process its settings through environment variables. The train
config decides the precision (a launcher precision that disagrees is an error, not a silent
override); FSDP's own activation checkpointing replaces the Trainer's; and N launched processes
that did not join one process group (CUDA-less ranks without use_cpu) would each train alone.
Work that writes shared files (a model cache, a dataset) runs on the main process first.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from rir_runtime.errors import UserInputError

logger = logging.getLogger(__name__)


def check_launch(training_args: Any) -> None:
    """The three launch checks; a no-op outside `accelerate launch` / torchrun."""
    check_precision(training_args)
    use_fsdp_checkpointing(training_args)
    check_process_group(training_args)


def check_precision(training_args: Any) -> None:
    """accelerate's `mixed_precision` must be `no` or the train config's: the Trainer would otherwise
    train in the launcher's precision when the config says fp32, and ignore it when the config says bf16."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    train = "fp16" if training_args.fp16 else "bf16" if training_args.bf16 else "no"
    if launcher in ("no", train):
        return
    says = {"fp16": "fp16: true", "bf16": "bf16: true", "no": "bf16: false and fp16: false (fp32)"}
    wants = {"fp16": "fp16: true, bf16: false", "bf16": "bf16: true", "fp8": "bf16: false and fp16: false"}
    raise UserInputError(
        f"accelerate launches with mixed_precision {launcher}, but the train config says {says[train]}: "
        "drop --mixed_precision (and mixed_precision from the accelerate config) to train as the train config "
        f"says, or set {wants.get(launcher, launcher)} in the train config"
    )


def use_fsdp_checkpointing(training_args: Any) -> None:
    """Under FSDP with `fsdp_activation_checkpointing`, turn the Trainer's gradient checkpointing off:
    both at once recompute twice (the Trainer refuses the pair), and FSDP's own is the one that fits it."""
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    fsdp_ac = os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true"
    names = [n for n in ("activation_checkpointing", "gradient_checkpointing") if getattr(training_args, n, False)]
    if not (fsdp and fsdp_ac and names):
        return
    for name in names:
        setattr(training_args, name, False)
    logger.warning("FSDP checkpoints activations itself (fsdp_activation_checkpointing): gradient_checkpointing is off")


def check_process_group(training_args: Any) -> None:
    """torchrun started WORLD_SIZE processes; each must see the others, or each trains alone on all data."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size != launched:
        raise UserInputError(
            f"{launched} processes were launched but they do not train together (this one sees "
            f"{training_args.world_size}): without GPUs pass --cpu to the launcher or set use_cpu: true"
        )


@contextlib.contextmanager
def main_process_first(training_args: Any, what: str) -> Iterator[None]:
    """The global main process does `what` first, then each machine's main, then the rest: files it
    writes (a prepared model, a dataset) are then read, not written again, by the others."""
    with (
        training_args.main_process_first(local=False, desc=what),
        training_args.main_process_first(local=True, desc=what),
    ):
        yield


def end_training(trainer: Any) -> None:
    """`trainer.end()` (trackers finished, process group destroyed), once the DDP wrapper is released.

    The wrapper's reducer holds the gloo process group. Freed after the group is destroyed, it is the
    group's last owner, and the group's destructor then runs holding the GIL while it waits for gloo's
    threads, one of which may need the GIL to free a finished collective's tensors: a hang at exit.
    """
    import gc

    from torch.nn.parallel import DistributedDataParallel

    if isinstance(trainer.model_wrapped, DistributedDataParallel):
        trainer.model_wrapped = trainer.model
        trainer.accelerator.free_memory()  # its own references to the wrapper
        gc.collect()
    trainer.end()
