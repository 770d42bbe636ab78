"""Faults of shared machines, each ending one of two ways: resumed with nothing lost and nothing twice,
or stopped with one line that names the cause and the way on (exit code 2), never a traceback."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rir_runtime.errors import EngineError, UserInputError
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.orchestration.output_lock import LOCK_FILE, exclusive_output
from rir_runtime.trace import read_records

REPO = Path(__file__).resolve().parent.parent
EVAL = [sys.executable, "-m", "rir_runtime.cli", "eval", "--env", "builtin", "--tasks", "workshop-2"]


def small_selection(out: Path, variations: str = "0-5") -> SelectionConfig:
    return SelectionConfig(
        env="builtin", tasks=["workshop-2"], variations=variations, methods=["react", "rir"], out=str(out)
    )


def holder(folder: Path) -> subprocess.Popen:
    """Another process that holds `folder` until it is killed."""
    code = (
        "import sys, time\n"
        "from rir_runtime.orchestration.output_lock import exclusive_output\n"
        "with exclusive_output(sys.argv[1], 'rir eval'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path: Path) -> None:
    jobs = expand_jobs(small_selection(tmp_path))
    first = holder(tmp_path)
    try:
        with pytest.raises(UserInputError, match=rf"being written by `rir eval` \(pid {first.pid}\).*another --out"):
            run_jobs(jobs, tmp_path / "episodes.jsonl")
        assert not (tmp_path / "episodes.jsonl").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    records = run_jobs(jobs, tmp_path / "episodes.jsonl")  # the killed holder's lock went with it
    assert len(records) == len(jobs) == len({r.episode_id for r in read_records(tmp_path / "episodes.jsonl")})
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released


def test_a_process_reenters_a_folder_it_holds(tmp_path: Path) -> None:
    with exclusive_output(tmp_path), exclusive_output(tmp_path / "."):
        run_jobs(expand_jobs(small_selection(tmp_path, "0")), tmp_path / "episodes.jsonl")


def test_two_evals_started_together_write_each_episode_once(tmp_path: Path) -> None:
    argv = [*EVAL, "--variations", "0-59", "--methods", "react,rir", "--out", str(tmp_path)]
    procs = [subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    # the later one is refused; or, started after the first had finished, it finds nothing left to run
    assert sorted(code for code, _ in results) in ([0, 2], [0, 0]), results
    for code, err in results:
        assert code == 0 or ("is being written by" in err and "Traceback" not in err), err
    ids = [json.loads(line)["episode_id"] for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 120


def test_a_full_disk_stops_with_one_line_and_the_rerun_resumes(tmp_path: Path) -> None:
    """A write limit (RLIMIT_FSIZE) stands in for a full disk: the write fails mid-run."""
    limited = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (30000, 30000))\n"
        "from rir_runtime.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = ["eval", "--env", "builtin", "--tasks", "workshop-2", "--variations", "0-29", "--out", str(tmp_path)]
    argv += ["--methods", "react,rir"]
    run = subprocess.run([sys.executable, "-c", limited, *argv], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("rir: error: the file size limit was reached writing ") and "episodes.jsonl" in last
    assert "resumes" in last and "Traceback" not in run.stderr
    written = len(read_records(tmp_path / "episodes.jsonl"))
    assert 0 < written < 60
    again = subprocess.run([*EVAL[:3], *argv], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    ids = [r.episode_id for r in read_records(tmp_path / "episodes.jsonl")]
    assert len(ids) == len(set(ids)) == 60


def test_a_storage_error_is_one_line_naming_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    from rir_runtime.errors import exit_code

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/run/episodes.jsonl")

    assert exit_code(full) == 2
    err = capsys.readouterr().err
    assert err.startswith("rir: error: no space left on the device writing /data/run/episodes.jsonl: make room")
    with pytest.raises(OSError):  # an OSError that is no storage fault stays a bug report
        exit_code(lambda: (_ for _ in ()).throw(OSError(errno.ECONNRESET, "reset")))


def test_an_unknown_model_is_refused_before_any_episode_without_waiting_on_the_hub(tmp_path: Path) -> None:
    argv = [*EVAL, "--variations", "0-1", "--methods", "react", "--policy", "llm:nosuch/model-xyz"]
    argv += ["--out", str(tmp_path / "run")]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("rir: error: model 'nosuch/model-xyz' is neither")
    assert "HF_HUB_OFFLINE is set" in run.stderr
    assert not (tmp_path / "run").exists()  # refused before the run began


def test_an_unreachable_hub_is_said_at_once_for_an_agent_and_a_prompted_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rir_runtime.errors import ModelLoadError
    from rir_runtime.llm import registry

    monkeypatch.setattr(registry, "hub_reachable", lambda: False)
    with pytest.raises(ModelLoadError, match="cannot be reached and the Hugging Face cache does not hold it"):
        SelectionConfig(env="builtin", policy="llm:nosuch/model-xyz", out=str(tmp_path))
    with pytest.raises(ModelLoadError, match="cannot be reached"):
        SelectionConfig(env="builtin", controller=["prompted:nosuch/model-xyz"], out=str(tmp_path))


def test_an_engine_that_dies_once_is_restarted_and_its_episode_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The retry around a dying engine (a stand-in death: the real JVM's is the integration test below)."""
    from rir_runtime.envs.builtin import WorkshopEnv

    jobs = expand_jobs(small_selection(tmp_path, "0-1"))
    calm = run_jobs(jobs, tmp_path / "calm" / "episodes.jsonl")
    step, deaths = WorkshopEnv.step, []

    def dies_once(self: WorkshopEnv, action: str):  # type: ignore[no-untyped-def]
        if not deaths:
            deaths.append(action)
            raise ConnectionResetError("engine gone")
        return step(self, action)

    monkeypatch.setattr(WorkshopEnv, "engine_died", lambda self, err: isinstance(err, ConnectionResetError))
    monkeypatch.setattr(WorkshopEnv, "step", dies_once)
    rerun = run_jobs(jobs, tmp_path / "rerun" / "episodes.jsonl")
    assert deaths and "engine died during" in capsys.readouterr().err
    assert [strip(r) for r in rerun] == [strip(r) for r in calm]

    monkeypatch.setattr(WorkshopEnv, "step", lambda self, action: (_ for _ in ()).throw(ConnectionResetError()))
    with pytest.raises(EngineError, match=r"engine died 3 times running .* run the same command again"):
        run_jobs(jobs, tmp_path / "dead" / "episodes.jsonl")


def strip(record) -> dict:  # type: ignore[no-untyped-def]
    """A record without its timings (they differ from run to run)."""
    data = record.to_json()
    return {k: v for k, v in data.items() if not k.endswith(("_s", "seconds"))}


@pytest.mark.integration
def test_a_killed_scienceworld_jvm_is_restarted_and_the_episode_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("scienceworld")
    from rir_runtime.envs.scienceworld_env import ScienceWorldEnv

    cfg = SelectionConfig(
        env="scienceworld", tasks=["find-living-thing"], variations="0", methods=["react"], out=str(tmp_path)
    )
    jobs = expand_jobs(cfg)
    calm = run_jobs(jobs, tmp_path / "calm" / "episodes.jsonl")
    step, kills = ScienceWorldEnv._step_engine, []

    def kill_the_jvm() -> None:
        java = subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True, text=True)
        kills.extend(int(pid) for pid in java.stdout.split())
        for pid in java.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.5)  # the JVM's port closes

    def kill_the_jvm_once(self: ScienceWorldEnv, action: str):  # type: ignore[no-untyped-def]
        if not kills and len(self._actions) == 3:
            kill_the_jvm()
        return step(self, action)

    monkeypatch.setattr(ScienceWorldEnv, "_step_engine", kill_the_jvm_once)
    rerun = run_jobs(jobs, tmp_path / "rerun" / "episodes.jsonl")  # killed mid-episode
    assert kills, "no JVM was found to kill"
    assert [strip(r) for r in rerun] == [strip(r) for r in calm]
    monkeypatch.setattr(ScienceWorldEnv, "_step_engine", step)
    kill_the_jvm()  # between episodes: the next one's first call meets a dead JVM
    between = run_jobs(jobs, tmp_path / "between" / "episodes.jsonl")
    assert [strip(r) for r in between] == [strip(r) for r in calm]


def test_py4j_tracebacks_on_the_root_logger_are_dropped_once_the_engine_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """py4j logs a JVM that died mid-call with `logging.exception` on the root logger: a traceback above the
    runtime's one-line warning that it restarted the engine. The engine's start drops those records only."""
    pytest.importorskip("py4j")
    import py4j.java_gateway

    from rir_runtime.envs.scienceworld_env import _FromPy4J, _quiet_py4j_root_records

    def log(pathname: str) -> None:
        fields = {"name": "root", "levelno": logging.ERROR, "levelname": "ERROR", "pathname": pathname}
        logging.getLogger().handle(logging.makeLogRecord({**fields, "msg": "Exception while sending command."}))

    root = logging.getLogger()
    root_filters = list(root.filters)
    root.filters[:] = [f for f in root_filters if not isinstance(f, _FromPy4J)]  # an engine started earlier
    try:
        _quiet_py4j_root_records()
        _quiet_py4j_root_records()  # once is enough: a second engine adds no second filter
        assert sum(isinstance(f, _FromPy4J) for f in root.filters) == 1
        log(py4j.java_gateway.__file__)
        assert not caplog.records
        log(__file__)  # everyone else's errors still reach the log
        assert [r.pathname for r in caplog.records] == [__file__]
    finally:
        root.filters[:] = root_filters


def test_a_corrupt_dataset_file_is_named(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    from train.common.data import load_dataset_dict

    rows = {"prompt": ["a prompt " * 20] * 200, "completion": ["an answer"] * 200}
    DatasetDict(train=Dataset.from_dict(rows), validation=Dataset.from_dict(rows)).save_to_disk(tmp_path / "review_sft")
    arrow = next((tmp_path / "review_sft" / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(UserInputError, match=rf"{arrow} is corrupt .*rebuild it with the same `rir build-data`"):
        load_dataset_dict(tmp_path / "review_sft")


@pytest.mark.parametrize("tear", ["cut", "zeros", "junk"])
def test_a_torn_last_record_is_skipped_and_rerun(tmp_path: Path, tear: str) -> None:
    jobs = expand_jobs(small_selection(tmp_path, "0-2"))
    path = tmp_path / "episodes.jsonl"
    run_jobs(jobs[:4], path)
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    torn = {"cut": data[: last + 30], "zeros": data[:last] + b"\0" * 40 + b"\n", "junk": data[:last] + b"\xff\xfe{" * 9}
    path.write_bytes(torn[tear])
    with pytest.warns(UserWarning, match="last line"):
        assert len(read_records(path)) == 3
    with pytest.warns(UserWarning, match="last line"):
        records = run_jobs(jobs, path)
    ids = [r.episode_id for r in read_records(path)]
    assert len(records) == len(jobs) == len(ids) == len(set(ids))


def test_a_killed_worker_stops_the_run_with_one_line_and_the_rerun_resumes(tmp_path: Path) -> None:
    argv = [*EVAL, "--variations", "0-299", "--methods", "react,rir", "--workers", "2", "--out", str(tmp_path)]
    path = tmp_path / "episodes.jsonl"
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and (not path.exists() or len(path.read_bytes().splitlines()) < 5):
        time.sleep(0.2)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "spawn_main"], capture_output=True, text=True)
    assert workers.stdout.split(), "no worker process found"
    os.kill(int(workers.stdout.split()[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("rir: error: a worker process died")
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    ids = [r.episode_id for r in read_records(path)]
    assert len(ids) == len(set(ids)) == 600


def test_a_checkpoint_with_a_torn_trainer_state_is_passed_over(tmp_path: Path) -> None:
    from rir_runtime.orchestration.launch import last_complete_checkpoint

    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_step": 4}'), (6, '{"global_st')):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-8").mkdir()  # a kill before its state was written
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-4"


def test_a_full_disk_while_saving_an_adapter_is_a_storage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from rir_runtime.errors import exit_code
    from train.common.crashes import storage_errors

    def save() -> None:
        with storage_errors("runs/sft"):
            raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                               '"No space left on device" })')  # fmt: skip

    assert exit_code(save) == 2
    assert capsys.readouterr().err.startswith("rir: error: no space left on the device writing runs/sft: make room")
    with pytest.raises(RuntimeError, match="other"), storage_errors("runs/sft"):
        raise RuntimeError("other")


def test_a_write_stopped_short_is_finished_or_fails_never_left_torn(tmp_path: Path) -> None:
    """An unbuffered write may stop short at a size limit and return the bytes it wrote; the record's
    remaining bytes are written, or the next write raises (EFBIG), never a torn line and exit code 0."""
    from rir_runtime.trace import append_record

    record = run_jobs(expand_jobs(small_selection(tmp_path, "0"))[:1], tmp_path / "episodes.jsonl")[0]

    class ShortWrites:
        mode = "ab"

        def __init__(self) -> None:
            self.data = b""

        def write(self, chunk: memoryview) -> int:
            self.data += bytes(chunk[:7])
            return min(7, len(chunk))

    fh = ShortWrites()
    append_record(fh, record)
    assert fh.data == (tmp_path / "episodes.jsonl").read_bytes()
