"""A crashed or killed training run: where to resume it (the newest checkpoint in output_dir), and an
out-of-memory crash turned into one error that says which setting to reduce.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rir_runtime.errors import RIRError

logger = logging.getLogger(__name__)


class TrainingResourceError(RIRError):
    """Training ran out of a resource (memory); the message says which setting to reduce."""


def last_checkpoint(training_args: Any) -> str | None:
    """The checkpoint to resume from: the one asked for, else the newest complete one in output_dir
    (after a kill; a checkpoint the kill interrupted is skipped)."""
    from rir_runtime.orchestration.launch import last_complete_checkpoint

    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    found = last_complete_checkpoint(Path(training_args.output_dir))
    if found:
        logger.warning("resuming from %s", found)
    return str(found) if found else None


@contextlib.contextmanager
def oom_advice(training_args: Any) -> Iterator[None]:
    """Re-raise an out-of-memory crash as one error that says what to reduce."""
    import torch

    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err).lower():
            raise
        a = training_args
        effective = a.per_device_train_batch_size * a.gradient_accumulation_steps
        raise TrainingResourceError(
            f"out of memory while training (per_device_train_batch_size={a.per_device_train_batch_size}, "
            f"gradient_accumulation_steps={a.gradient_accumulation_steps}, max_length={a.max_length}, "
            f"gradient_checkpointing={a.gradient_checkpointing}). Reduce per_device_train_batch_size and raise "
            f"gradient_accumulation_steps to keep the effective batch of {effective}, lower max_length, and enable "
            "gradient_checkpointing; then rerun (training resumes from the last checkpoint)"
        ) from err


# How safetensors and torch report a full disk or a file-size limit: not as an OSError, as a message.
STORAGE_MESSAGES = {
    "os error 28": errno.ENOSPC,
    "No space left on device": errno.ENOSPC,
    "os error 27": errno.EFBIG,
    "File too large": errno.EFBIG,
    "file write failed": errno.EIO,  # torch.save's writer, cut short
    "unexpected pos": errno.EIO,
    "iostream error": errno.EIO,  # torch.save's C++ stream, cut short
}


@contextlib.contextmanager
def storage_errors(output_dir: str) -> Iterator[None]:
    """A checkpoint or adapter write that fails for lack of space, reported as the OSError it is (one
    line at the CLI: make room, then rerun; training resumes from its last whole checkpoint)."""
    try:
        yield
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors' and torch's own error classes
        code = next((n for text, n in STORAGE_MESSAGES.items() if text in str(err)), None)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), output_dir) from err
