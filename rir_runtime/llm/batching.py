"""A thread-safe backend whose calls from a lockstep group go out as one batch.

Every model a process shares (`shared.py`) is wrapped in a `BatchingBackend`. A call from a thread
outside any group goes straight to the model, one at a time (a local model runs one forward pass at a
time: threads sharing a CPU only slow each other down, and its tokenizer is never used from two
threads at once). A call from a thread of a lockstep group (`rir_runtime/lockstep.py`: the branches of
a valued decision, or the episodes a worker runs in threads) waits until every live member of the group
waits too, and then the group's calls to this model go out together: prompts to `generate` settings
by settings, scoring requests as one `score_many`, constrained choices as one `choose_many` (one
batched forward locally; concurrent requests to an OpenAI-compatible server, which batches them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from rir_runtime.llm.base import Backend, Choice, Completion, Prompt
from rir_runtime.lockstep import current_group

# (max_new_tokens, stop strings, temperature): prompts with other settings cannot share a call.
_Settings = tuple[int, tuple[str, ...] | None, float]
_Asked = tuple[Prompt, list[str]]  # a prompt to generate after, and its hints


class BatchingBackend:
    """A `Backend` around another one: thread-safe, with a lockstep group's calls batched."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self.batches: list[int] = []  # how many calls each batch a group sent here held, for benchmarks

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
        hints: Sequence[Sequence[str]] | None = None,
    ) -> list[Completion]:
        settings: _Settings = (max_new_tokens, tuple(stop) if stop is not None else None, temperature)
        asked = [(p, list(hints[i]) if hints else []) for i, p in enumerate(prompts)]
        group = current_group()
        if group is None:
            return self._generate([asked], settings)[0]
        return group.call((id(self), "generate", settings), lambda lists: self._generate(lists, settings), asked)

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]:
        return self.score_many([(prompt, continuations)])[0]

    def score_many(self, requests: Sequence[tuple[Prompt, list[str]]]) -> list[list[float]]:
        group = current_group()
        if group is None:
            with self._lock:
                return self.backend.score_many(requests)
        return group.call((id(self), "score"), self._score_requests, list(requests))

    def choose(
        self, prompt: Prompt, choices: list[str], penalties: Sequence[float] | None = None
    ) -> tuple[int, Completion]:
        return self.choose_many([(prompt, choices, penalties)])[0]

    def choose_many(self, requests: Sequence[Choice]) -> list[tuple[int, Completion]]:
        group = current_group()
        if group is None:
            with self._lock:
                return self.backend.choose_many(requests)
        return group.call((id(self), "choose"), self._choose_requests, list(requests))

    def forget_prefixes(self) -> None:
        forget = getattr(self.backend, "forget_prefixes", None)
        if forget is not None:
            with self._lock:
                forget()

    # --- what a group sends: each member's payload was one call's list of requests -------------------
    def _generate(self, lists: list[list[_Asked]], settings: _Settings) -> list[list[Completion]]:
        max_new_tokens, stop, temperature = settings

        def run(flat: list[_Asked]) -> list[Completion]:
            return self.backend.generate(
                [prompt for prompt, _ in flat],
                max_new_tokens=max_new_tokens,
                stop=list(stop) if stop is not None else None,
                temperature=temperature,
                hints=[hints for _, hints in flat] if any(hints for _, hints in flat) else None,
            )

        return self._at_once(lists, run)

    def _score_requests(self, payloads: list[list[tuple[Prompt, list[str]]]]) -> list[list[list[float]]]:
        return self._at_once(payloads, self.backend.score_many)

    def _choose_requests(self, payloads: list[list[Choice]]) -> list[list[tuple[int, Completion]]]:
        return self._at_once(payloads, self.backend.choose_many)

    def _at_once(self, payloads: list[list[Any]], run: Callable[[list[Any]], list[Any]]) -> list[list[Any]]:
        """The members' requests as one call to the model, its results handed back member by member."""
        self.batches.append(len(payloads))
        with self._lock:
            flat = run([request for requests in payloads for request in requests])
        if len(flat) != sum(map(len, payloads)):
            raise RuntimeError(f"the backend returned {len(flat)} results for {sum(map(len, payloads))} requests")
        out, start = [], 0
        for requests in payloads:
            out.append(flat[start : start + len(requests)])
            start += len(requests)
        return out
