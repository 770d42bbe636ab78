"""The folder where RIR keeps what it makes once and reads often: prepared models, generated TextWorld
games, ScienceWorld gold paths. `$RIR_CACHE_DIR` moves it (the tests point it at a temp folder)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cache_dir(*parts: str, root: str | os.PathLike[str] | None = None) -> Path:
    """`root`, else `$RIR_CACHE_DIR`, else ~/.cache/rir; joined with `parts`."""
    base = root or os.environ.get("RIR_CACHE_DIR") or Path.home() / ".cache" / "rir"
    return Path(base).expanduser().joinpath(*parts)


def write_atomic(path: Path, text: str) -> None:
    """Write through a temp file in the same folder, then rename: a killed run leaves the old file or
    none, never half of one, and two workers writing the same entry both leave a whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    """The file's sha256, read in blocks: a model file of gigabytes never sits in memory whole."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
