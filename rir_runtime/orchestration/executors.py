"""Where work items run: in this process, in local worker processes or threads, or on a Ray cluster.

Episodes (`rir rollout`, `rir eval`) and labelling (`rir build-data`) hand an executor a list of
independent items and a *worker factory*, and get results back as they finish, in any order. The
caller writes each result to its append-only file as it arrives, so a killed driver loses only the
items in flight, and the results cannot depend on which worker ran an item or when.

A worker factory runs once per worker (process, Ray actor, or once for a thread pool) and returns
the callable that handles items. Environments and models are expensive to create, so workers are
long-lived: Ray workers are actors, each holding its own environments and model backend for the
whole run (a Ray task would be scheduled on any pooled process, and GPU tasks get a fresh process
per call by default, reloading the model each time).

Items go to workers in chunks whose size adapts to the measured time per item: one at a time while
items are slow (LLM episodes: results stream back as each finishes), more when they take a few
milliseconds (noisy-expert episodes), where one round trip per item would cost more than the item.

A caller that maps many small batches (a trainer's reward function, one batch per step) opens a
`session`: its workers (processes, Ray actors and their environments) live until the session closes,
instead of being started and stopped around every batch.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rir_runtime.errors import DependencyMissingError, UserInputError, WorkerDiedError

T = TypeVar("T")
R = TypeVar("R")
T_in = TypeVar("T_in", contravariant=True)
R_out = TypeVar("R_out", covariant=True)
Worker = Callable[[T], R]
WorkerFactory = Callable[[], Callable[[T], R]]  # picklable (a module-level function or a partial of one)
Chunk = tuple[list[R], float]  # the results of one chunk and the seconds its worker spent on it

EXECUTORS = ("local", "ray")
RAY_INSTALL = 'pip install -e ".[ray]"'
CHUNK_SECONDS = 0.5  # a chunk's target duration: amortises round trips, keeps results streaming
MAX_CHUNK = 256


class Session(Protocol[T_in, R_out]):
    """Workers made once, mapped over many batches of items."""

    def map(self, items: Sequence[T_in]) -> Iterator[R_out]:
        """Each item's result, in completion order."""
        ...

    def close(self) -> None:
        """Close the workers (their environments) and stop their processes or actors."""
        ...


class Executor(Protocol):
    def map_unordered(self, make_worker: WorkerFactory[T, R], items: Sequence[T]) -> Iterator[R]:
        """Each item's result, in completion order."""
        ...

    def session(self, make_worker: WorkerFactory[T, R]) -> Session[T, R]:
        """Workers that stay up across `map` calls until `close`."""
        ...


def mapped_once(session: Session[T, R], items: Sequence[T]) -> Iterator[R]:
    """One batch through a session that closes after it (or when the caller stops reading)."""
    try:
        yield from session.map(items)
    finally:
        session.close()


def check_executor(executor: str, ray_address: str) -> None:
    """Validate the executor settings of a config before any work starts."""
    if executor not in EXECUTORS:
        raise UserInputError(f"executor '{executor}' is not one of {', '.join(EXECUTORS)}")
    if ray_address and executor != "ray":
        raise UserInputError(f"ray_address '{ray_address}' is set but executor is '{executor}': add --executor ray")
    if executor == "ray":
        import_ray()


def make_executor(executor: str, workers: int = 1, threads: int = 1, ray_address: str = "") -> Executor:
    """`workers` processes (or Ray actors), each running `threads` items at a time."""
    check_executor(executor, ray_address)
    if executor == "ray":
        return RayExecutor(workers, threads, ray_address)
    return LocalExecutor(workers, threads)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DependencyMissingError(
            f"--executor ray needs Ray, an optional extra: install it with `{RAY_INSTALL}` "
            "(or run with --executor local)"
        ) from None
    return ray


# --- the dispatcher shared by every parallel executor ---------------------------------------------
def run_chunk(worker: Worker[T, R], chunk: list[T]) -> Chunk[R]:
    start = time.perf_counter()
    results = [worker(item) for item in chunk]
    return results, time.perf_counter() - start


@dataclass
class ChunkSizer:
    """How many items the next chunk gets: enough to last about `target_s`, never more than a fair
    share of what is left (so the last chunks do not leave workers idle)."""

    slots: int
    target_s: float = CHUNK_SECONDS
    items: int = 0
    seconds: float = 0.0

    def record(self, items: int, seconds: float) -> None:
        self.items += items
        self.seconds += seconds

    def next_size(self, remaining: int) -> int:
        if not self.items:
            return 1  # nothing measured yet: a slow first item must not hold a large chunk
        per_item = max(self.seconds / self.items, 1e-6)
        size = min(MAX_CHUNK, max(1, int(self.target_s / per_item)))
        return max(1, min(size, math.ceil(remaining / self.slots)))


def stream(slots: Sequence[Callable[[list[T]], Future[Chunk]]], items: Sequence[T]) -> Iterator[R]:
    """Keep one chunk in flight per slot; yield results as chunks finish. A slot submits a chunk to
    one worker (or to a pool); a failed chunk raises here, after which the caller shuts down."""
    pending, sizer = deque(items), ChunkSizer(len(slots))
    running: dict[Future[Chunk], int] = {}

    def submit(slot: int) -> None:
        n = min(sizer.next_size(len(pending)), len(pending))
        running[slots[slot]([pending.popleft() for _ in range(n)])] = slot

    for slot in range(min(len(slots), len(pending))):
        submit(slot)
    while running:
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            slot = running.pop(future)
            results, seconds = future.result()
            sizer.record(len(results), seconds)
            if pending:
                submit(slot)  # before yielding: the worker runs while the caller writes
            yield from results


# --- workers ----------------------------------------------------------------------------------------
class LazyWorker:
    """One worker of a process pool, and the Ray actor class: it holds its worker (environments, a
    model) for the whole run. The worker is made on first use, so a failure to build it (a model
    that does not load) comes back as the first item's error, not as a pool respawning a failing
    initializer forever or an actor that died before its first call."""

    def __init__(self, make_worker: WorkerFactory[Any, Any]) -> None:
        self.make_worker = make_worker
        self.worker: Worker[Any, Any] | None = None
        self.lock = threading.Lock()  # a threaded Ray actor runs several chunks at once

    def run(self, chunk: list[Any]) -> Chunk:
        with self.lock:
            if self.worker is None:
                self.worker = self.make_worker()
        return run_chunk(self.worker, chunk)

    def close(self) -> None:
        if self.worker is not None:
            _close(self.worker)


_PROCESS_WORKER: list[LazyWorker] = []  # the worker of a pool process


def _init_process(make_worker: WorkerFactory[Any, Any], cpu_threads: int) -> None:
    share_cpus(cpu_threads)
    _PROCESS_WORKER.append(LazyWorker(make_worker))


def share_cpus(cpu_threads: int) -> None:
    """Give this worker process its share of the CPU's threads, unless the user set OpenMP's count.
    Each torch process otherwise starts one thread per core: two workers on two cores would run four
    spinning threads. With one thread each, two workers ran model-controlled episodes a third faster
    than one worker of two threads (`rir eval`, prompted and value controllers, 2-core CPU)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = str(cpu_threads)  # read by torch when it is first imported
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(cpu_threads)


def _process_chunk(chunk: list[T]) -> Chunk:
    return _PROCESS_WORKER[0].run(chunk)


def _close(worker: object) -> None:
    close = getattr(worker, "close", None)
    if callable(close):
        close()


# --- local ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalExecutor:
    """In this process (one worker, one thread), in threads sharing one worker (`threads` > 1: their
    model calls batch together), or in `workers` spawned processes with a worker each."""

    workers: int = 1
    threads: int = 1

    def map_unordered(self, make_worker: WorkerFactory[T, R], items: Sequence[T]) -> Iterator[R]:
        if self.threads <= 1 and len(items) <= 1:
            return mapped_once(InProcess(make_worker), items)  # a pool for one item costs more than the item
        return mapped_once(self.session(make_worker), items)

    def session(self, make_worker: WorkerFactory[T, R]) -> Session[T, R]:
        if self.threads > 1:
            return Threads(make_worker, self.threads)
        if self.workers <= 1:
            return InProcess(make_worker)
        return Processes(make_worker, self.workers)


class InProcess:
    """The worker in the caller's process, made on first use."""

    def __init__(self, make_worker: WorkerFactory[Any, Any]) -> None:
        self.worker = LazyWorker(make_worker)

    def map(self, items: Sequence[Any]) -> Iterator[Any]:
        for item in items:
            yield self.worker.run([item])[0][0]

    def close(self) -> None:
        self.worker.close()


class Threads:
    """`threads` threads sharing one worker made in the caller's process."""

    def __init__(self, make_worker: WorkerFactory[Any, Any], threads: int) -> None:
        self.worker, self.threads = make_worker(), threads
        self.pool = ThreadPoolExecutor(threads)

    def map(self, items: Sequence[Any]) -> Iterator[Any]:
        submit = lambda chunk: self.pool.submit(run_chunk, self.worker, chunk)  # noqa: E731
        yield from stream([submit] * self.threads, items)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        _close(self.worker)


class Processes:
    """`workers` spawned processes, each holding its worker until the session closes. A worker that
    dies (killed, out of memory) breaks the pool at once, and the run stops with one line; a pool
    that replaced it silently would wait forever on the chunk it held."""

    def __init__(self, make_worker: WorkerFactory[Any, Any], workers: int) -> None:
        self.workers = workers
        cpu_threads = max(1, (os.cpu_count() or 1) // workers)
        self.pool = ProcessPoolExecutor(
            workers, mp.get_context("spawn"), initializer=_init_process, initargs=(make_worker, cpu_threads)
        )

    def map(self, items: Sequence[Any]) -> Iterator[Any]:
        def submit(chunk: list[Any]) -> Future[Chunk]:
            return self.pool.submit(_process_chunk, chunk)

        try:
            yield from stream([submit] * self.workers, items)
        except BrokenProcessPool:
            raise WorkerDiedError(
                "a worker process died (killed, or out of memory): run the same command again; it resumes "
                "from what was written"
            ) from None

    def close(self) -> None:
        for process in list(getattr(self.pool, "_processes", {}).values()):  # their environments end with them
            process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)


# --- Ray --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RayExecutor:
    """`workers` Ray actors of one CPU each, each running `threads` items at a time (a threaded
    actor: its items' model calls batch together). Uses the Ray runtime this process is already
    connected to, else connects to `address`, else starts a local cluster of `workers` CPUs for the
    run. Workers import this project: on a remote cluster, install it on every node."""

    workers: int = 1
    threads: int = 1
    address: str = ""

    def map_unordered(self, make_worker: WorkerFactory[T, R], items: Sequence[T]) -> Iterator[R]:
        if not items:
            return iter(())
        return mapped_once(RaySession(make_worker, min(self.workers, len(items)), self.threads, self.address), items)

    def session(self, make_worker: WorkerFactory[T, R]) -> Session[T, R]:
        return RaySession(make_worker, self.workers, self.threads, self.address)


class RaySession:
    """Ray actors that hold their workers until the session closes; a local cluster started for the
    session stops with it."""

    def __init__(self, make_worker: WorkerFactory[Any, Any], workers: int, threads: int, address: str) -> None:
        self.ray = import_ray()
        self.owned = connect_ray(self.ray, address, workers)
        actor_cls = self.ray.remote(num_cpus=1, max_concurrency=threads)(LazyWorker)
        self.actors = [actor_cls.remote(make_worker) for _ in range(workers)]
        self.slots = [_actor_slot(actor) for actor in self.actors for _ in range(threads)]

    def map(self, items: Sequence[Any]) -> Iterator[Any]:
        yield from stream(self.slots, items)

    def close(self) -> None:
        try:
            _stop_actors(self.ray, self.actors)
        finally:
            self.actors = []
            if self.owned:
                self.ray.shutdown()  # stops the local cluster it started, or disconnects from the remote one


def _actor_slot(actor: Any) -> Callable[[list[Any]], Future[Chunk]]:
    return lambda chunk: actor.run.remote(chunk).future()


def _stop_actors(ray: Any, actors: list[Any]) -> None:
    """Let each actor close its environments (engines may run in subprocesses), then end it."""
    if not actors:
        return
    try:
        ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=10)
    finally:
        for actor in actors:
            ray.kill(actor)


def connect_ray(ray: Any, address: str, num_cpus: int) -> bool:
    """Connect to Ray (quietly, no dashboard); True when this call connected, so the run disconnects
    at its end; False when the caller had connected already (a notebook, a test's cluster)."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        return True
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a throwaway local cluster: nothing to report
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    return True
