"""One backend per model spec and process, shared by whatever in the process asks for that model: the
episodes of a worker, the hindsight labeller's agent continuations, the offline scores of controllers.
A model is loaded once per process, however many episodes, continuations or rows use it. Each is
wrapped in a `BatchingBackend`: safe across threads, and the calls of a lockstep group's threads (the
branches of a valued decision, a worker's concurrent episodes) go to it as one batch.
"""

from __future__ import annotations

import threading

from rir_runtime.llm.base import Backend
from rir_runtime.llm.batching import BatchingBackend

_BACKENDS: dict[str, BatchingBackend] = {}
_LOCK = threading.Lock()


def shared_backend(spec: str) -> Backend:
    """The process's backend of `spec` (made on first use)."""
    with _LOCK:
        if spec not in _BACKENDS:
            from rir_runtime.llm.factory import make_backend

            _BACKENDS[spec] = BatchingBackend(make_backend(spec))
        return _BACKENDS[spec]


def forget_prefixes() -> None:
    """Drop the prompt caches every shared model kept: an episode then depends on its own calls alone
    (a reused prefix agrees with a recomputed one up to float rounding)."""
    with _LOCK:
        backends = list(_BACKENDS.values())
    for backend in backends:
        backend.forget_prefixes()


def forget_shared_backends() -> None:
    """Drop every shared backend (a benchmark that measures loading starts afresh)."""
    with _LOCK:
        _BACKENDS.clear()
