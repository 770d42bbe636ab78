"""Cross-episode batching: model calls from concurrent episodes become one batched call.

Episodes run in threads; each calls `generate([one prompt])` as if it were alone. This wrapper
queues the requests and a single dispatcher thread sends them to the backend in batches (up to
`max_batch`, or whatever arrived within `wait_s`), so a local model does one padded forward pass
for many episodes instead of many small ones. `score` and `choose` are already one batched pass
per call; they go straight to the wrapped backend. Every call into the wrapped backend holds one
lock: a local model then runs one forward pass at a time (threads sharing a CPU only slow each
other down), and its tokenizer is never used from two threads at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from rir_runtime.llm.base import Backend, Completion, Prompt

# (max_new_tokens, stop strings, temperature): requests with different settings cannot share a call.
_Settings = tuple[int, tuple[str, ...] | None, float]
_Request = tuple[Prompt, _Settings, "Future[Completion]"]


class BatchingBackend:
    """A `Backend` around another one: thread-safe, with `generate` batched across threads."""

    def __init__(self, backend: Backend, max_batch: int = 8, wait_s: float = 0.02) -> None:
        self.backend, self.max_batch, self.wait_s = backend, max_batch, wait_s
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._lock = threading.Lock()
        self.batches: list[int] = []  # sizes of the batches sent, for benchmarks
        threading.Thread(target=self._dispatch, daemon=True, name="batching-backend").start()

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def supports_scoring(self) -> bool:
        return self.backend.supports_scoring

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int,
        stop: list[str] | None = None,
        temperature: float = 0.0,
    ) -> list[Completion]:
        settings: _Settings = (max_new_tokens, tuple(stop) if stop is not None else None, temperature)
        futures: list[Future[Completion]] = []
        for prompt in prompts:
            future: Future[Completion] = Future()
            self._queue.put((prompt, settings, future))
            futures.append(future)
        return [f.result() for f in futures]

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]:
        with self._lock:
            return self.backend.score(prompt, continuations)

    def choose(
        self, prompt: Prompt, choices: list[str], penalties: Sequence[float] | None = None
    ) -> tuple[int, Completion]:
        with self._lock:
            return self.backend.choose(prompt, choices, penalties)

    def _dispatch(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get(timeout=self.wait_s))
                except queue.Empty:
                    break
            groups: dict[_Settings, list[_Request]] = {}
            for request in batch:
                groups.setdefault(request[1], []).append(request)
            for settings, requests in groups.items():
                self.batches.append(len(requests))
                self._send(settings, requests)

    def _send(self, settings: _Settings, requests: list[_Request]) -> None:
        max_new_tokens, stop, temperature = settings
        try:
            with self._lock:
                outs = self.backend.generate(
                    [prompt for prompt, _, _ in requests],
                    max_new_tokens=max_new_tokens,
                    stop=list(stop) if stop is not None else None,
                    temperature=temperature,
                )
            if len(outs) != len(requests):  # before any future is set: the error goes to all of them
                raise RuntimeError(f"the backend returned {len(outs)} replies for {len(requests)} prompts")
            for (_, _, future), out in zip(requests, outs, strict=True):
                future.set_result(out)
        except Exception as err:  # hand the error to every waiting episode
            for _, _, future in requests:
                future.set_exception(err)
