"""Executors: local processes and threads, and Ray actors, for episodes and labelling.

The unit tests check the plumbing without Ray: chunking, streaming, errors, the missing-extra error,
and that neither records nor labels depend on which worker finished first. The integration tests
run on a local Ray cluster of 2 CPUs: `--executor ray` gives the local executor's records and
labels, and a killed driver resumes without duplicates.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from data_gen import labelling as build_module
from data_gen.build import build, load_runs
from data_gen.build_config import BuildConfig
from data_gen.labelling import episodes_to_label
from data_gen.points import decision_points
from data_gen.rollout import RolloutConfig, rollout
from eval.harness import EvalConfig, evaluate
from rir_runtime.errors import DependencyMissingError, UserInputError
from rir_runtime.orchestration import executors
from rir_runtime.orchestration.executors import ChunkSizer, LocalExecutor, check_executor, make_executor, stream
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import read_records

REPO = Path(__file__).resolve().parents[1]


# --- workers the executors run (module level: spawned processes import them by name) ---------------
def times(factor: int) -> Callable[[int], int]:
    return partial(int.__mul__, factor)


def fail_on(bad: int) -> Callable[[int], int]:
    def work(x: int) -> int:
        if x == bad:
            raise ValueError(f"item {x} failed")
        return x

    return work


@dataclass
class CountingFactory:
    """A worker factory that counts the workers it made (a thread pool must share one)."""

    made: list[int] = field(default_factory=list)

    def __call__(self) -> Callable[[int], int]:
        self.made.append(threading.get_ident())
        return times(2)


def worker_identity() -> Callable[[int], tuple[int, int]]:
    """A worker that answers with its process and its own identity: a kept worker answers the same."""
    made = object()
    return lambda _item: (os.getpid(), id(made))


def torch_threads() -> Callable[[int], tuple[str | None, int]]:
    """A worker that answers with its OpenMP setting and torch's thread count (torch imported after
    the worker process started, as an episode's model is)."""
    import torch

    return lambda _item: (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())


def strip_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("wall_s", "controller_seconds")}  # timings


def episodes(path: Path) -> dict[str, dict[str, Any]]:
    """Records by episode id, timing aside; fails on a duplicate id."""
    records = [strip_timing(r.to_json()) for r in read_records(path)]
    by_id = {r["episode_id"]: r for r in records}
    assert len(by_id) == len(records), "an episode was written twice"
    return by_id


def labels(folder: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in (folder / "labels.jsonl").read_text().splitlines()]
    by_id = {row["point_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a decision point was labelled twice"
    return by_id


# --- chunking and streaming -------------------------------------------------------------------------
def test_chunks_start_at_one_item_and_grow_to_the_target_duration() -> None:
    sizer = ChunkSizer(slots=2, target_s=0.5)
    assert sizer.next_size(remaining=1000) == 1  # nothing measured: a slow item must not hold a chunk
    sizer.record(items=10, seconds=0.01)  # 1 ms per item
    assert sizer.next_size(remaining=10_000) == executors.MAX_CHUNK  # 500 items would last 0.5 s: capped
    assert sizer.next_size(remaining=100) == 50  # a fair share of what is left, so no worker idles
    slow = ChunkSizer(slots=2, target_s=0.5)
    slow.record(items=1, seconds=3.0)  # LLM episodes: one at a time, each streams back as it ends
    assert slow.next_size(remaining=1000) == 1


def test_stream_yields_every_item_once_whatever_the_chunking() -> None:
    submitted: list[list[int]] = []

    def slot(chunk: list[int]) -> Future:
        submitted.append(chunk)
        future: Future = Future()
        future.set_result(([x * 10 for x in chunk], 0.0001 * len(chunk)))
        return future

    out = list(stream([slot, slot, slot], range(500)))
    assert sorted(out) == [x * 10 for x in range(500)]
    assert max(len(c) for c in submitted) > 1  # fast items were batched into chunks
    assert len(submitted) < 500


@pytest.mark.parametrize("executor", [LocalExecutor(1, 1), LocalExecutor(1, 3), LocalExecutor(2, 1)], ids=str)
def test_local_executors_return_every_result(executor: LocalExecutor) -> None:
    assert sorted(executor.map_unordered(partial(times, 3), list(range(40)))) == [3 * x for x in range(40)]


def test_threads_share_one_worker_so_their_model_calls_batch() -> None:
    factory = CountingFactory()
    assert sorted(LocalExecutor(1, 4).map_unordered(factory, list(range(20)))) == [2 * x for x in range(20)]
    assert len(factory.made) == 1


@pytest.mark.parametrize("executor", [LocalExecutor(1, 1), LocalExecutor(1, 2), LocalExecutor(2, 1)], ids=str)
def test_a_failing_item_raises_in_the_driver(executor: LocalExecutor) -> None:
    with pytest.raises(ValueError, match="item 7 failed"):
        list(executor.map_unordered(partial(fail_on, 7), list(range(12))))


@pytest.mark.parametrize("executor", [LocalExecutor(1, 1), LocalExecutor(1, 2), LocalExecutor(2, 1)], ids=str)
def test_a_session_keeps_its_workers_across_batches(executor: LocalExecutor) -> None:
    """A trainer's reward maps one small batch per step: its workers (and their environments) must not
    be made again for each batch. Closing the session stops them."""
    session = executor.session(worker_identity)
    try:
        first = set(session.map(list(range(8))))
        second = set(session.map(list(range(8))))
    finally:
        session.close()
    # which of its workers a batch reaches depends on the load; none is made for the second batch
    assert len(first | second) <= executor.workers, (first, second)
    one_off = set(executor.map_unordered(worker_identity, list(range(8))))
    assert one_off.isdisjoint(first | second) or executor.workers == 1  # a new map without the session: new workers


def test_worker_processes_share_the_cpu_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers each starting a thread per core would run twice as many spinning threads as cores."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # the parent computes the share
    assert set(LocalExecutor(2, 1).map_unordered(torch_threads, list(range(4)))) == {("2", 2)}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a user's own setting wins
    assert set(LocalExecutor(2, 1).map_unordered(torch_threads, list(range(4)))) == {("1", 1)}


# --- choosing an executor ---------------------------------------------------------------------------
def test_without_ray_the_ray_executor_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(DependencyMissingError, match=r'pip install -e "\.\[ray\]"'):
        make_executor("ray", workers=2)
    with pytest.raises(DependencyMissingError, match=r'pip install -e "\.\[ray\]"'):
        SelectionConfig(executor="ray")
    with pytest.raises(DependencyMissingError, match=r'pip install -e "\.\[ray\]"'):
        BuildConfig(rollouts=["runs/x"], executor="ray")


def test_executor_settings_are_checked_before_any_work() -> None:
    with pytest.raises(UserInputError, match="executor 'dask' is not one of local, ray"):
        check_executor("dask", "")
    with pytest.raises(UserInputError, match="executor is 'local': add --executor ray"):
        SelectionConfig(ray_address="auto")
    with pytest.raises(ValueError, match="cannot be combined"):
        SelectionConfig(workers=2, concurrency=2)  # local processes do not batch across episodes


@pytest.mark.parametrize("stage, cls", [("rollout", RolloutConfig), ("eval", EvalConfig), ("build-data", BuildConfig)])
def test_cli_stages_take_the_executor_flags(stage: str, cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    from rir_runtime.cli import build_parser, stage_config

    monkeypatch.setattr(executors, "import_ray", lambda: None)  # parsing needs no Ray
    argv = [stage, "--executor", "ray", "--ray-address", "auto", "--workers", "2", "--rollouts", "r"]
    cfg = stage_config(build_parser().parse_args(argv if stage == "build-data" else argv[:-2]), cls)
    assert (cfg.executor, cfg.ray_address, cfg.workers) == ("ray", "auto", 2)


# --- records and labels do not depend on completion order -----------------------------------------
@dataclass(frozen=True)
class ReversedExecutor:
    """Runs items in reverse order, in this process: the latest episode finishes first."""

    def map_unordered(self, make_worker: Callable[[], Callable[[Any], Any]], items: Sequence[Any]) -> Iterator[Any]:
        worker = make_worker()
        yield from (worker(item) for item in reversed(items))
        getattr(worker, "close", lambda: None)()


def test_local_processes_write_the_same_records_as_one_process(tmp_path: Path) -> None:
    cfg = SelectionConfig(env="builtin", variations="0-3", methods=["react", "rir"], seeds=[0, 1])
    jobs = expand_jobs(cfg)
    run_jobs(jobs, tmp_path / "one.jsonl")
    run_jobs(jobs, tmp_path / "two.jsonl", workers=2)
    assert episodes(tmp_path / "one.jsonl") == episodes(tmp_path / "two.jsonl")
    assert len(episodes(tmp_path / "one.jsonl")) == len(jobs)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rollout")
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-7", out=str(out)))
    return out


def test_labels_and_datasets_do_not_depend_on_completion_order(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "in-order")))
    monkeypatch.setattr(build_module, "make_executor", lambda *args: ReversedExecutor())
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "reversed")))
    first, second = tmp_path / "in-order", tmp_path / "reversed"
    assert labels(first) == labels(second)
    assert list(labels(first)) != list(labels(second))  # the cache was written in another order
    for name in ("review_sft", "locate_pref"):
        a, b = (json.loads((d / name / "dataset_dict.json").read_text()) for d in (first, second))
        assert a == b
        rows = [(d / name / "train" / "data-00000-of-00001.arrow").read_bytes() for d in (first, second)]
        assert rows[0] == rows[1], f"{name} rows depend on the order labels finished in"


def test_a_point_in_two_episodes_is_labelled_once_and_agent_values_follow_the_first(run_dir: Path) -> None:
    eps = load_runs([str(run_dir)])
    twice = [eps[0], eps[1], eps[0]]  # the same episode in two runs: one label, from its first place
    points = [decision_points(r, s)[-4:] for r, s in twice]
    todo = episodes_to_label(twice, points, {}, BuildConfig(rollouts=[str(run_dir)], label_value="agent"))
    assert [t.record.episode_id for t in todo] == [eps[0][0].episode_id, eps[1][0].episode_id]
    assert {t.value_source[0].episode_id for t in todo if t.value_source} == {eps[0][0].episode_id}
    done = {p.id: {} for p in points[0]}
    expert = BuildConfig(rollouts=[str(run_dir)])
    assert [t.record.episode_id for t in episodes_to_label(twice, points, done, expert)] == [eps[1][0].episode_id]


# --- Ray (integration: a local cluster of 2 CPUs) ---------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason=f"Ray is an optional extra: {executors.RAY_INSTALL}")
    executors.connect_ray(ray, "", 2)
    yield
    ray.shutdown()


def small_eval(out: Path, **kw: Any) -> EvalConfig:
    """A few methods and controllers on a few variations of the builtin workshop (noisy expert)."""
    selection = dict(variations="0-3", methods=["react", "reflexion", "rir"], controller=["heuristic", "oracle"])
    return EvalConfig(**{"env": "builtin", "seeds": [0, 1], "out": str(out), **selection, **kw})


@pytest.mark.integration
def test_ray_build_data_writes_the_local_labels(ray_cluster: None, run_dir: Path, tmp_path: Path) -> None:
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "local")))
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "ray"), executor="ray", workers=2))
    assert labels(tmp_path / "ray") == labels(tmp_path / "local")
    for name in ("review_sft", "locate_sft", "review_pref"):
        a, b = ((tmp_path / d / name / "train" / "data-00000-of-00001.arrow").read_bytes() for d in ("local", "ray"))
        assert a == b, f"{name} differs between the local and the Ray build"


@pytest.mark.integration
def test_a_killed_ray_eval_resumes_to_the_local_executors_records(ray_cluster: None, tmp_path: Path) -> None:
    """A real `rir eval --executor ray` (its own local cluster) killed mid-run, then run again on Ray: its
    records and summary are a local run's, none twice."""
    cfg = small_eval(tmp_path / "ray", variations="0-24", seeds=[0, 1])
    argv = [sys.executable, "-m", "rir_runtime.cli", "eval", "--executor", "ray", "--workers", "2", "--env", "builtin"]
    argv += ["--variations", cfg.variations, "--methods", ",".join(cfg.methods)]
    argv += ["--controller", ",".join(cfg.controller), "--seeds", "0,1", "--out", cfg.out]
    path = Path(cfg.out) / "episodes.jsonl"
    log = tmp_path / "driver.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=REPO, start_new_session=True, stderr=stderr)
        try:
            while proc.poll() is None and (not path.exists() or path.stat().st_size < 100_000):
                time.sleep(0.2)
        finally:
            exited = proc.poll()  # None: still running, so the kill below is what stops it
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
            proc.wait()
    assert exited is None, f"the driver exited on its own ({exited}) before the kill:\n{log.read_text()[-2000:]}"
    written = len(path.read_text().splitlines())
    jobs = expand_jobs(cfg)
    assert 0 < written < len(jobs), "the run was not killed mid-way: raise the number of episodes"
    evaluate(replace(cfg, executor="ray", workers=2))
    evaluate(replace(cfg, out=str(tmp_path / "local")))
    assert episodes(path) == episodes(tmp_path / "local" / "episodes.jsonl")
    assert len(episodes(path)) == len(jobs)
    tables = [json.loads((Path(d) / "summary.json").read_text())["methods"] for d in (cfg.out, tmp_path / "local")]
    assert [{k: strip_timing(v) for k, v in table.items()} for table in tables] == [
        {k: strip_timing(v) for k, v in tables[1].items()}
    ] * 2


def test_a_relabelled_point_gets_the_reflections_it_got_uninterrupted(run_dir: Path, tmp_path: Path) -> None:
    """Only an episode's first `reflect_points` recoveries get reflections: a point relabelled after a
    kill (its episode's other labels cached) must count the cached ones, or it gets reflections it did
    not have uninterrupted."""
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "whole")))
    whole = labels(tmp_path / "whole")
    rows = [json.loads(line) for line in (tmp_path / "whole" / "labels.jsonl").read_text().splitlines()]
    episodes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        episodes.setdefault(row["point_id"].rsplit("#", 1)[0], []).append(row)
    recoveries = [
        [r for r in mine if r["review"] == "recover" and r["restore"] is not None] for mine in episodes.values()
    ]
    late = next(mine[1] for mine in recoveries if len(mine) > 1)  # its episode's second recovery: no reflections
    assert not late["reflections"]
    (tmp_path / "resumed").mkdir()
    kept = [r for r in rows if r["point_id"] != late["point_id"]]
    (tmp_path / "resumed" / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    shutil.copy(tmp_path / "whole" / "labels.json", tmp_path / "resumed" / "labels.json")
    build(BuildConfig(rollouts=[str(run_dir)], out=str(tmp_path / "resumed")))
    assert labels(tmp_path / "resumed") == whole
