"""One writer per output folder. Two runs appending to one `episodes.jsonl` would both resume from the
records each saw and write the rest twice; the second is refused instead, naming the first. The lock is
an advisory `flock` on `<folder>/.rir.lock`: the kernel drops it when its holder dies, so the lock of a
killed run is taken over by the next one without any cleanup.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rir_runtime.errors import UserInputError

LOCK_FILE = ".rir.lock"
_HELD: dict[Path, int] = {}  # folders this process holds (re-entered by nested stages), with a depth


@contextmanager
def exclusive_output(folder: str | Path, command: str = "rir") -> Iterator[None]:
    """Hold `folder` for this process while the block writes into it; another process holding it is
    refused with one line. Re-entering a folder this process already holds is allowed."""
    path = Path(folder).expanduser().resolve()
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield
        finally:
            _HELD[path] -= 1
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise UserInputError(
                f"{path} is being written by {holder}: wait for it to finish, or pass another --out "
                "(two runs into one folder would write episodes twice)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"`{command}` (pid {os.getpid()})".encode(), 0)
        _HELD[path] = 1
        try:
            yield
        finally:
            del _HELD[path]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the descriptor releases the lock
