"""One backend per model spec and process, shared by whatever in the process asks for that model: the
episodes of a worker (their model calls batched when they run concurrently), the hindsight labeller's
agent continuations, the offline scores of controllers. A model is loaded once per process, however
many episodes, continuations or rows use it.
"""

from __future__ import annotations

import threading

from rir_runtime.llm.base import Backend

_BACKENDS: dict[str, Backend] = {}
_LOCK = threading.Lock()
_BATCH = {"size": 1}


def shared_backend(spec: str) -> Backend:
    """The process's backend of `spec` (made on first use); with concurrent episodes, wrapped to batch
    their calls (`batch_shared_backends`)."""
    with _LOCK:
        if spec not in _BACKENDS:
            from rir_runtime.llm.batching import BatchingBackend
            from rir_runtime.llm.factory import make_backend

            backend = make_backend(spec)
            if _BATCH["size"] > 1:
                backend = BatchingBackend(backend, _BATCH["size"])  # mypy checks the wrapper against `Backend` here
            _BACKENDS[spec] = backend
        return _BACKENDS[spec]


def batch_shared_backends(concurrency: int) -> None:
    """Backends made from now on batch the calls of `concurrency` episodes run in threads of this process."""
    _BATCH["size"] = concurrency


def forget_shared_backends() -> None:
    """Drop every shared backend (a benchmark that measures loading, or a new batch size, starts afresh)."""
    with _LOCK:
        _BACKENDS.clear()
