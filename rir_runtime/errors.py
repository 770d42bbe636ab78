"""One error hierarchy, so the CLI can print a single clear line instead of a deep stack trace.

Every error a user can cause carries the problem *and* the fix in its message. `exit_code` is the one
place that turns such an error into that line (`rir: error: ...`) and exit code 2, for every entry
point: `rir`, and `python -m train.<stage>` with or without accelerate.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any


class RIRError(Exception):
    """Base class for every error this project raises on purpose."""


class UserInputError(RIRError):
    """Bad input from the user: an unknown name, a malformed config, a wrong split."""


class UnknownNameError(UserInputError):
    """A name (env, task, model, method, controller) that is not known; lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...], hint: str = "") -> None:
        import difflib

        close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1)
        suggestion = f" Did you mean '{close[0]}'?" if close else ""
        shown = ", ".join(str(v) for v in list(valid)[:40]) + (", ..." if len(valid) > 40 else "")
        super().__init__(f"unknown {kind} '{name}'.{suggestion} Valid: {shown}.{(' ' + hint) if hint else ''}")


class EngineError(RIRError):
    """A benchmark's engine process died again and again: an infrastructure failure a rerun retries."""


class WorkerDiedError(RIRError):
    """A worker process of a run died under it: an infrastructure failure a rerun resumes from."""


class DependencyMissingError(RIRError):
    """A runtime the environment needs (Java, a package) is missing; says how to install it."""


class RestoreError(RIRError):
    """A checkpoint could not be restored faithfully; the runtime never continues on a diverged state."""


class ModelLoadError(RIRError):
    """A model name that is neither registered, a folder, nor reachable; or a corrupt cache entry."""


class ParseError(RIRError):
    """A model reply that cannot be parsed into the expected decision."""


class ServerError(RIRError):
    """A model server answered with an HTTP error that retrying did not cure; says what to change."""


# Errors of the storage a run writes to: expected on shared machines, so one line each, not a traceback.
STORAGE_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "the file size limit was reached",
    errno.EIO: "a write was cut short (a full disk or a file-size limit)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
}


def storage_error(err: OSError) -> str:
    """The one line a full, read-only or forbidden output gets: what, where, and how to go on."""
    where = f" writing {err.filename}" if err.filename else ""
    return (
        f"{STORAGE_ERRORS[err.errno or 0]}{where}: make room or fix the permissions (or pass another --out), then "
        "run the same command again; it resumes from what it wrote"
    )


def close_progress_bars() -> None:
    """Close open tqdm bars now, so the error line is the last one printed (not a bar closed at exit)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        return
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()


def exit_code(main: Callable[..., Any], *args: Any) -> int:
    """Run an entry point's work: its own exit code (None or anything else that is not an int: 0); an
    error raised on purpose (`RIRError`) is one line on stderr and exit code 2; Ctrl-C is 130."""
    try:
        code = main(*args)
    except RIRError as err:
        close_progress_bars()
        print(f"rir: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in STORAGE_ERRORS:
            raise
        close_progress_bars()
        print(f"rir: error: {storage_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rir: interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0
