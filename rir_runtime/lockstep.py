"""Threads whose model calls go out together: a lockstep group.

Valuing a decision by the agent itself plays many continuations (each option, each draw) of one
agent. Each continuation is ordinary sequential code (the episode loop, or `play_on`), run in a
thread of its own. The threads of a group do not call the model directly: a call waits until every
live thread of the group waits on one too, and then all of them go to their backend as one batch
(`llm/batching.py` routes a group's calls here). So at each step the live branches' agent calls make
one batched forward on a local model, or as many concurrent requests to a server, without the
branches' code knowing; a branch that ends leaves the group, and the others no longer wait for it.

Which calls share a batch depends only on which branches are alive, never on timing, so a group's
results are what the same calls would give one at a time, up to float rounding in the batched pass.
A thread that starts a group of its own (the episode's oracle asking for values inside a group of
episodes) stops counting in its outer group while the inner one runs, so the outer one cannot wait
for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Send = Callable[[list[Any]], list[Any]]  # the payloads of one key's calls -> their results, in order

_local = threading.local()


@dataclass(eq=False)
class _Call:
    key: Hashable  # calls with equal keys go out in one batch: the backend and what is asked of it
    send: Send
    payload: Any
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class Lockstep:
    """A group of threads whose model calls are gathered until every live member waits on one."""

    batches: list[int] = field(default_factory=list)  # sizes of the batches sent, for benchmarks
    _live: int = 0
    _queue: list[_Call] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def reserve(self, n: int) -> None:
        """Count n members before their threads start (each then enters `member(reserved=True)`), so the
        first to call does not find itself alone."""
        with self._cond:
            self._live += n

    @contextmanager
    def member(self, reserved: bool = False) -> Iterator[None]:
        """The calling thread takes part in the group inside the block."""
        outer = current_group()
        if not reserved:
            self.reserve(1)
        _local.group = self
        try:
            yield
        finally:
            _local.group = outer
            self._leave()

    def call(self, key: Hashable, send: Send, payload: Any) -> Any:
        """Queue one call and wait for its result; the last member to queue sends the batch."""
        call = _Call(key, send, payload)
        with self._cond:
            self._queue.append(call)
            batch = self._take()
            while batch is None and not call.done:
                self._cond.wait()
                batch = self._take()
        if batch is not None:
            self._send(batch)
        if call.error is not None:
            raise call.error
        return call.result

    def _take(self) -> list[_Call] | None:
        """The queued calls, when every live member has queued one (under the lock)."""
        if self._queue and len(self._queue) >= self._live:
            batch, self._queue = self._queue, []
            return batch
        return None

    def _send(self, batch: list[_Call]) -> None:
        """Each key's calls in one `send`, outside the lock (the other members are waiting anyway)."""
        by_key: dict[Hashable, list[_Call]] = {}
        for call in batch:
            by_key.setdefault(call.key, []).append(call)
        for calls in by_key.values():
            self.batches.append(len(calls))
            try:
                results = calls[0].send([c.payload for c in calls])
                if len(results) != len(calls):
                    raise RuntimeError(f"a batch of {len(calls)} calls came back with {len(results)} results")
                for c, r in zip(calls, results, strict=True):
                    c.result = r
            except BaseException as err:  # noqa: BLE001 - every caller of the batch gets the error
                for c in calls:
                    c.error = err
        with self._cond:
            for call in batch:
                call.done = True
            self._cond.notify_all()

    def _leave(self) -> None:
        with self._cond:
            self._live -= 1
            batch = self._take()
        if batch is not None:
            self._send(batch)

    @contextmanager
    def _suspended(self) -> Iterator[None]:
        """The calling member stops counting while it waits on something else (a group of its own)."""
        self._leave()
        _local.group = None
        try:
            yield
        finally:
            with self._cond:
                self._live += 1
            _local.group = self


def current_group() -> Lockstep | None:
    """The lockstep group the calling thread is a member of, if any."""
    return getattr(_local, "group", None)


@contextmanager
def outside_group() -> Iterator[None]:
    """The calling thread's group (if any) does not wait for it inside the block."""
    group = current_group()
    if group is None:
        yield
        return
    with group._suspended():
        yield


@dataclass
class _Outcome(Generic[T]):
    value: T | None = None
    error: BaseException | None = None


def run_together(jobs: Sequence[Callable[[int], T]], width: int) -> list[T]:
    """Every job, at most `width` at a time in threads of one lockstep group (width 1: one after another
    in the calling thread); results in the jobs' order. A job is called with its thread's slot (0 ..
    width - 1), so a caller can give each slot an environment of its own. The first job's error is
    raised after all have ended."""
    if width <= 1 or len(jobs) <= 1:
        return [job(0) for job in jobs]
    outcomes: list[_Outcome[T]] = [_Outcome() for _ in jobs]
    group, lock = Lockstep(), threading.Lock()
    pending = iter(range(len(jobs)))

    def worker(slot: int) -> None:
        with group.member(reserved=True):
            while True:
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                try:
                    outcomes[i].value = jobs[i](slot)
                except BaseException as err:  # noqa: BLE001 - handed to the caller below
                    outcomes[i].error = err

    threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in range(min(width, len(jobs)))]
    group.reserve(len(threads))
    with outside_group():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
    return [outcome.value for outcome in outcomes]  # type: ignore[misc]
