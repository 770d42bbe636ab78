"""Cross-episode batching: model calls from concurrent episodes become one batched call.

Episodes run in threads; each calls `generate([one prompt])` as if it were alone. This wrapper
queues the requests and a single dispatcher thread sends them to the backend in batches (up to
`max_batch`, or whatever arrived within `wait_s`), so a local model does one padded forward pass
for many episodes instead of many small ones.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any


class BatchingBackend:
    """Wraps a backend; thread-safe `generate` and `score` with cross-thread batching of `generate`."""

    def __init__(self, backend: Any, max_batch: int = 8, wait_s: float = 0.02) -> None:
        self.backend, self.max_batch, self.wait_s = backend, max_batch, wait_s
        self.name = getattr(backend, "name", "backend")
        self._queue: queue.Queue[tuple[Any, dict[str, Any], Future]] = queue.Queue()
        self._score_lock = threading.Lock()
        self.batches: list[int] = []  # sizes of the batches sent, for benchmarks
        threading.Thread(target=self._dispatch, daemon=True, name="batching-backend").start()

    def generate(self, prompts: list[Any], **kwargs: Any) -> list[Any]:
        futures = []
        for prompt in prompts:
            future: Future = Future()
            self._queue.put((prompt, kwargs, future))
            futures.append(future)
        return [f.result() for f in futures]

    def score(self, prompt: Any, continuations: list[str]) -> list[float]:
        with self._score_lock:  # one forward pass at a time; the pass is already batched over actions
            return self.backend.score(prompt, continuations)

    def _dispatch(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get(timeout=self.wait_s))
                except queue.Empty:
                    break
            # Requests with different generation settings cannot share a call: group them.
            groups: dict[str, list[tuple[Any, dict[str, Any], Future]]] = {}
            for item in batch:
                groups.setdefault(repr(sorted(item[1].items())), []).append(item)
            for items in groups.values():
                self.batches.append(len(items))
                try:
                    outs = self.backend.generate([p for p, _, _ in items], **items[0][1])
                    if len(outs) != len(items):  # before any future is set: the error goes to all of them
                        raise RuntimeError(f"the backend returned {len(outs)} replies for {len(items)} prompts")
                    for (_, _, future), out in zip(items, outs, strict=True):
                        future.set_result(out)
                except Exception as err:  # hand the error to every waiting episode
                    for _, _, future in items:
                        future.set_exception(err)
