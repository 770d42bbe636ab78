"""A seeded fault-injection campaign over the long commands, in the spirit of SQLite's I/O-error tests and
Jepsen: each command is hit by faults at seeded random moments, then run again, and what it leaves is
compared record by record with an uninterrupted run of the same command.

    python bench/fault_campaign.py --seed 0 --out /tmp/faults                        # the full campaign
    python bench/fault_campaign.py --seed 0 --out /tmp/faults --fast                 # without TextWorld/ScienceWorld
    python bench/fault_campaign.py --seed 0 --out /tmp/faults --only eval-builtin,build-data --per-cell 1
    python bench/fault_campaign.py --seed 0 --out /tmp/faults --one eval-builtin/kill/2   # replay one fault

Cells are commands (`eval-builtin`, `train-sft`, `pipeline`, ...), each kept small; fault kinds are
`kill` (SIGKILL the process group once a seeded number of records, bytes or seconds is reached),
`kill-worker` (SIGKILL a child: a pool worker, a reward worker, the trainer of the pipeline, the JVM),
`disk-full` (a seeded RLIMIT_FSIZE below the largest output file: the stand-in of tests/test_faults.py),
`torn-input` (a run killed, then the last line of its newest output cut, zeroed or overwritten with junk;
for build-data also the rollout it reads) and `second-writer` (the same command started twice into one
folder, a seeded 0-3 s apart). Each fault ends as exactly one of:

- `resumed`: after running the same command again, the output equals the reference: episodes by id and
  content less timings, dataset rows and labels, adapters loadable at their max steps;
- `stopped-one-line`: exit code 2 and one `rir: error: ...` line, no traceback; the rerun then resumes;
- `other`: anything else (a traceback, a hang, a lost or duplicated record), with a reason.

References are computed once per cell and kept under `--out/refs`; every fault runs in
`--out/runs/<cell>/<kind>/<i>` (logs included). The end prints a table (also `--out/table.md`) and every
`other` with the command that replays it; `--out/faults.json` lists every injection.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KINDS = ("kill", "kill-worker", "disk-full", "torn-input", "second-writer")
OUTCOMES = ("resumed", "stopped-one-line", "other")
MIN_FAULTS = 100  # the default --per-cell makes the full campaign inject at least this many
POLL_S = 0.01  # how often a running command's output is measured for its fault's moment
TIMING_SUFFIXES = ("_s", "seconds")  # record fields that differ from run to run (wall_s, controller_seconds)

# --- the commands ----------------------------------------------------------------------------------------
EVAL_BUILTIN = ["eval", "--env", "builtin", "--tasks", "workshop-2", "--variations", "0-29", "--methods", "react,rir"]
ROLLOUT = ["rollout", "--env", "builtin", "--tasks", "workshop-3", "--split", "train", "--variations", "0-9"]
ROLLOUT += ["--methods", "rir", "--budget_agent", "40", "--budget_rollback", "1", "--error_rate", "0.3"]
# the tiny model's byte-level tokenizer makes prompts ~4x longer in tokens than SmolLM2's
TRAIN_FLAGS = ["--model", "tiny-random-llama", "--max_steps", "6", "--save_steps", "2", "--max_length", "4096"]
TRAIN_FLAGS += ["--eval_strategy", "no"]
GRPO = ["train", "grpo", "--config", "configs/train/grpo_online_cpu.yaml", "--model", "tiny-random-llama"]
GRPO += ["--sft_adapter", "null", "--use_vllm", "false", "--max_steps", "4", "--save_steps", "2"]
GRPO += ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--num_generations", "2"]
GRPO += ["--max_train_samples", "8", "--eval_strategy", "no", "--calibrate_review", "false"]
EVAL_TW = ["eval", "--env", "textworld-cooking", "--tasks", "recipe2", "--variations", "0-1", "--methods", "rir"]
EVAL_SW = ["eval", "--env", "scienceworld", "--tasks", "find-living-thing", "--variations", "0-1"]
EVAL_SW += ["--methods", "rir"]

# `rir` under a fault: the file-size limit that stands in for a full disk, and (online GRPO on the tiny random
# model, whose replies no parser accepts) review verdicts decided by a reply's bytes, as tests/test_online_grpo.py
# does, so decisions are played out by reward workers. Guarded: spawned workers import the main module again.
WRAPPER = '''"""`rir` under a fault (written by bench/fault_campaign.py)."""
import resource
import signal
import sys

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    args = sys.argv[2:]
    if args[:1] == ["--fsize"]:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(args[1]), int(args[1])))
        args = args[2:]
    if args[:1] == ["--byte-verdicts"]:
        import train.common.online_rewards as rewards

        rewards.review_verdict = lambda text: ("continue", "recover")[len(text) % 2]
        args = args[1:]
    from rir_runtime.cli import main

    sys.exit(main(args))
'''


@dataclass(frozen=True)
class Case:
    """The folder of one run set (a reference or a fault): the command writes into `work`, logs sit beside."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"


Check = Callable[[Case, Case, dict[str, str]], "str | None"]  # (fault, reference, path tokens) -> a mismatch


@dataclass(frozen=True)
class Cell:
    """One command under test. `worker_argv` gives it a child process to kill (None: it has none); `child`
    narrows the victims to command lines holding it (the JVM); `needs` is a shared input made once."""

    name: str
    argv: Callable[[Case], list[str]]
    check: Check
    worker_argv: tuple[str, ...] | None = None
    child: str = ""
    slow: bool = False
    verdicts: bool = False
    needs: str = ""

    def kinds(self) -> list[str]:
        return [k for k in KINDS if k != "kill-worker" or self.worker_argv is not None]


@dataclass(frozen=True)
class Inputs:
    """What several cells read: a small builtin rollout, the datasets built from it, a pipeline SFT config."""

    root: Path

    @property
    def rollout(self) -> Path:
        return self.root / "rollout"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sft_config(self) -> Path:
        return self.root / "sft_pipeline.yaml"


def make_cells(inputs: Inputs) -> dict[str, Cell]:
    """Every command of the campaign, each small enough for seconds to a minute on a 2-core CPU, in the
    order they run. `--workers 2` (`--reward_workers 2`) is what gives a command a worker to kill."""
    workers = ("--workers", "2")
    cells = [
        episodes_cell("eval-builtin", EVAL_BUILTIN, "episodes.jsonl", workers),
        episodes_cell("rollout-builtin", ROLLOUT, "episodes-0.jsonl", workers),
        Cell("build-data", partial(build_argv, inputs), data_check, workers, needs="rollout"),
        Cell("train-sft", partial(train_argv, inputs, "sft"), adapter_check("controller", 6), needs="data"),
        Cell("train-value", partial(train_argv, inputs, "value"), adapter_check("value", 6), needs="data"),
        Cell(
            "train-grpo-online",
            partial(train_argv, inputs, "grpo"),
            adapter_check("controller", 4),
            ("--reward_workers", "2"),
            verdicts=True,
            needs="data",
        ),
        episodes_cell("eval-textworld", EVAL_TW, "episodes.jsonl", workers, slow=True),
        episodes_cell("eval-scienceworld", EVAL_SW, "episodes.jsonl", (), child="java", slow=True),
        Cell("pipeline", partial(pipeline_argv, inputs), pipeline_check, (), needs="sft_config"),
    ]
    return {cell.name: cell for cell in cells}


def episodes_cell(name: str, args: list[str], episodes: str, worker_argv: tuple[str, ...], **kw: Any) -> Cell:
    """A command that writes episodes into `--out`."""
    return Cell(name, lambda case: [*args, "--out", str(case.work)], episodes_check(episodes), worker_argv, **kw)


def build_argv(inputs: Inputs, case: Case) -> list[str]:
    """build-data on the shared rollout, or on the fault's own copy of it (torn-input tears a copy)."""
    own = case.root / "rollout"
    return ["build-data", "--rollouts", str(own if own.exists() else inputs.rollout), "--out", str(case.work)]


def train_argv(inputs: Inputs, stage: str, case: Case) -> list[str]:
    if stage == "grpo":
        return [*GRPO, "--data", str(inputs.data), "--output_dir", str(case.work)]
    config = {"sft": "configs/train/sft_cpu_quick.yaml", "value": "configs/train/value_cpu_quick.yaml"}[stage]
    out = ["--data", str(inputs.data), "--output_dir", str(case.work)]
    return ["train", stage, "--config", config, *TRAIN_FLAGS, *out]


def pipeline_argv(inputs: Inputs, case: Case) -> list[str]:
    return ["pipeline", "--config", str(pipeline_yaml(case, inputs))]


def pipeline_yaml(case: Case, inputs: Inputs) -> Path:
    """configs/pipeline/quickstart.yaml cut down to seconds (tests/test_configs_and_pipeline.py's tiny one):
    the tiny model, 12 rollouts, 4 SFT steps saved every 2, no value controller, the heuristic evaluated."""
    import yaml

    cfg = yaml.safe_load((REPO / "configs/pipeline/quickstart.yaml").read_text())
    cfg.update(
        out=str(case.work),
        base_model="tiny-random-llama",
        sft_config=str(inputs.sft_config),
        sft_max_steps=4,
        sft_max_length=4096,
        value_config="",
        controller_eval_rows=2,
        controller_eval_reflect_rows=0,
        explore=["random-review"],
        budget_agent=16,
        workers=1,
        suites=[{"env": "builtin", "tasks": ["workshop-3"], "train_variations": "0-5", "test_variations": "0-1"}],
        eval_methods=["react", "rir"],
        eval_controllers=["heuristic"],
    )
    path = case.root / "pipeline.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def prepare_inputs(inputs: Inputs, needs: set[str]) -> None:
    """Make the shared inputs once (kept across campaigns in the same --out): the rollout, its datasets."""
    import yaml

    if needs & {"rollout", "data"} and not (inputs.rollout / "run.json").exists():
        run_plainly([*ROLLOUT, "--out", str(inputs.rollout)], inputs.root / "rollout.log")
    if "data" in needs and not (inputs.data / "build.json").exists():
        run_plainly(
            ["build-data", "--rollouts", str(inputs.rollout), "--out", str(inputs.data)], inputs.root / "data.log"
        )
    if "sft_config" in needs:
        sft = yaml.safe_load((REPO / "configs/train/sft_cpu_quick.yaml").read_text())
        sft.update(save_steps=2, save_total_limit=None, eval_strategy="no", eval_on_start=False)
        inputs.sft_config.write_text(yaml.safe_dump(sft))


def run_plainly(args: list[str], log: Path) -> None:
    """An input the campaign needs; its failure ends the campaign (no fault can be judged without it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        code = subprocess.call(rir_argv(args), cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=child_env())
    if code != 0:
        raise SystemExit(f"fault_campaign: `rir {' '.join(args)}` failed ({code}); see {log}")


# --- comparing outputs with the reference ----------------------------------------------------------------
def normalised(value: Any, tokens: dict[str, str]) -> Any:
    """A record without its timings, the run's own folders replaced by tokens (they differ per fault)."""
    if isinstance(value, dict):
        return {k: normalised(v, tokens) for k, v in value.items() if not k.endswith(TIMING_SUFFIXES)}
    if isinstance(value, list):
        return [normalised(v, tokens) for v in value]
    if isinstance(value, str):
        for path in sorted(tokens, key=len, reverse=True):
            value = value.replace(path, tokens[path])
    return value


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Every line of a finished JSONL file; a torn or corrupt line is a problem once the command is done."""
    if not path.is_file():
        return [], f"{path.name} is missing"
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        return [], f"{path.name} ends with a torn line"
    rows = []
    for n, line in enumerate(data.splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            return [], f"{path.name}:{n} is not JSON"
    return rows, None


def compare_keyed(got: Path, want: Path, key: str, tokens: dict[str, str]) -> str | None:
    """Records of two JSONL files by `key`: none twice, none lost, none extra, each equal to the reference's."""
    rows, problem = read_jsonl(got)
    if problem:
        return problem
    seen: set[str] = set()
    for row in rows:
        if str(row.get(key)) in seen:
            return f"duplicate record {row.get(key)} in {got.name}"
        seen.add(str(row.get(key)))
    reference = {str(r[key]): r for r in read_jsonl(want)[0]}
    if lost := sorted(set(reference) - seen):
        return f"{len(lost)} record(s) lost from {got.name}, e.g. {lost[0]}"
    if extra := sorted(seen - set(reference)):
        return f"{len(extra)} record(s) in {got.name} that the reference lacks, e.g. {extra[0]}"
    for row in rows:
        mine, theirs = normalised(row, tokens), normalised(reference[str(row[key])], tokens)
        if mine != theirs:
            fields = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            return f"record {row[key]} in {got.name} differs from the reference in {', '.join(fields)}"
    return None


def episodes_check(name: str) -> Check:
    """The episodes file by episode id, and the summary files an interrupted run writes last."""

    def check(case: Case, ref: Case, tokens: dict[str, str]) -> str | None:
        problem = compare_keyed(case.work / name, ref.work / name, "episode_id", tokens)
        if problem:
            return problem
        for last in ("summary.json", "run.json"):
            if (ref.work / last).exists() and not (case.work / last).exists():
                return f"{last} is missing"
        return None

    return check


def data_check(case: Case, ref: Case, tokens: dict[str, str]) -> str | None:
    """build-data: the labels by point id, and every dataset's splits row by row."""
    return compare_data(case.work, ref.work, tokens)


def compare_data(got: Path, want: Path, tokens: dict[str, str]) -> str | None:
    """A build-data folder against the reference's: labels by point id, then each dataset split row by row
    (rows come in episode-id order, so a resumed build must give the very same lists)."""
    from datasets import load_from_disk

    problem = compare_keyed(got / "labels.jsonl", want / "labels.jsonl", "point_id", tokens)
    if problem:
        return problem
    names = sorted(p.parent.name for p in want.glob("*/dataset_dict.json"))
    if extra := sorted({p.parent.name for p in got.glob("*/dataset_dict.json")} - set(names)):
        return f"datasets the reference lacks: {extra}"
    for name in names:
        if not (got / name / "dataset_dict.json").exists():
            return f"dataset {name} is missing"
        mine, theirs = load_from_disk(str(got / name)), load_from_disk(str(want / name))
        if sorted(mine) != sorted(theirs):
            return f"dataset {name} has splits {sorted(mine)}, the reference {sorted(theirs)}"
        for split in theirs:
            if normalised(mine[split].to_list(), tokens) != normalised(theirs[split].to_list(), tokens):
                return f"dataset {name}/{split}: its {len(mine[split])} rows differ from the reference's"
    return None


def adapter_check(kind: str, max_steps: int) -> Check:
    def check(case: Case, ref: Case, tokens: dict[str, str]) -> str | None:
        return check_adapter(case.work, kind, max_steps)

    return check


def check_adapter(folder: Path, kind: str, max_steps: int) -> str | None:
    """Training's result: a card that reads, a safetensors file that opens, max_steps reached, each step
    logged once (two trainers into one folder would log steps twice)."""
    from safetensors import safe_open

    from rir_runtime.llm.card import read_card

    try:
        read_card(folder, expect=kind)
        with safe_open(str(folder / "adapter_model.safetensors"), "pt") as weights:
            if not list(weights.keys()):
                return "adapter_model.safetensors holds no tensors"
        state = json.loads((folder / "trainer_state.json").read_text())
    except Exception as err:  # a broken adapter, whatever the library raised
        return f"adapter does not load: {type(err).__name__}: {str(err)[:200]}"
    if state.get("global_step") != max_steps:
        return f"training stopped at step {state.get('global_step')} of {max_steps}"
    steps = [entry["step"] for entry in state.get("log_history", []) if "loss" in entry]
    if steps != sorted(set(steps)):
        return f"the training log repeats or reorders steps: {steps}"
    return None


def pipeline_check(case: Case, ref: Case, tokens: dict[str, str]) -> str | None:
    """Every stage's output: rollout and evaluation episodes, the datasets, the SFT adapter, the report."""
    got, want = case.work, ref.work
    return (
        compare_keyed(
            got / "rollout-builtin/episodes-0.jsonl", want / "rollout-builtin/episodes-0.jsonl", "episode_id", tokens
        )
        or compare_data(got / "data", want / "data", tokens)
        or check_adapter(got / "sft", "controller", 4)
        or compare_keyed(
            got / "eval-builtin/episodes.jsonl", want / "eval-builtin/episodes.jsonl", "episode_id", tokens
        )
        or (None if (got / "report.md").is_file() else "report.md is missing")
    )


# --- running a command -----------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    if "RIR_CACHE_DIR" not in env and (REPO / ".cache/rir").is_dir():
        env["RIR_CACHE_DIR"] = str(REPO / ".cache/rir")  # where this checkout's converted models live
    return env


def rir_argv(args: Sequence[str], wrapper: Path | None = None, fsize: int = 0, verdicts: bool = False) -> list[str]:
    """`rir <args>` as this interpreter runs it; through the wrapper where a fault or a patch needs it."""
    if wrapper is None or not (fsize or verdicts):
        return [sys.executable, "-m", "rir_runtime.cli", *args]
    head = [sys.executable, str(wrapper), str(REPO)]
    return [*head, *(["--fsize", str(fsize)] if fsize else []), *(["--byte-verdicts"] if verdicts else []), *args]


@dataclass
class Run:
    """One finished (or stopped) command: how it ended and where its stderr is."""

    name: str
    argv: list[str]
    log: Path
    code: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    fired: bool = False  # the fault's moment came while it ran (and the fault was applied)

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def killed(self) -> bool:
        """Stopped by the campaign's own SIGKILL of its group (not by a fault it met on its own)."""
        return self.fired and self.code == -signal.SIGKILL and not self.timed_out


Inject = Callable[[subprocess.Popen, float], bool]  # (process, seconds since start) -> applied now


def launch(name: str, argv: list[str], folder: Path) -> tuple[subprocess.Popen, Run, float]:
    """Start a command in a session of its own, so a kill reaches its whole process group."""
    folder.mkdir(parents=True, exist_ok=True)
    run = Run(name, argv, folder / f"{name}.log")
    with run.log.open("wb") as err, (folder / f"{name}.out").open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True, env=child_env()
        )
    return proc, run, time.monotonic()


def watch(proc: subprocess.Popen, run: Run, start: float, timeout: float, inject: Inject | None = None) -> Run:
    """Wait for the command, applying the fault once its moment comes; past `timeout` it is a hang."""
    while proc.poll() is None:
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            stop(proc)
            run.timed_out = True
            break
        if inject is not None and not run.fired and inject(proc, elapsed):
            run.fired = True
        time.sleep(POLL_S)
    run.code, run.seconds = proc.returncode, time.monotonic() - start
    kill_pids(group_members(proc.pid))  # what it left running in its group (a pool's orphaned workers)
    return run


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(pid: int) -> list[int]:
    table, found, todo = proc_table(), [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, (ppid, _) in table.items() if ppid == parent]
        found += children
        todo += children
    return found


def group_members(pgid: int) -> list[int]:
    return [p for p, (_, group) in proc_table().items() if group == pgid]


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL a command's group and whatever it started outside the group, then reap it."""
    family = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    kill_pids(family)
    proc.wait()


def command_line(proc: int) -> str:
    try:
        return Path(f"/proc/{proc}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# --- a fault's moment ------------------------------------------------------------------------------------
_LINES: dict[tuple[str, int], int] = {}  # (path, size) -> complete lines, so polling reads a file once a size


def progress(work: Path) -> tuple[int, int]:
    """(records, bytes) a command has written: JSONL lines plus complete training checkpoints; all bytes."""
    records = size = 0
    for folder, _dirs, files in os.walk(work):
        for name in files:
            path = os.path.join(folder, name)
            try:
                length = os.stat(path).st_size
            except OSError:
                continue
            size += length
            if name.endswith(".jsonl"):
                records += count_lines(path, length)
            elif name == "trainer_state.json" and os.path.basename(folder).startswith("checkpoint-"):
                records += 1
    return records, size


def count_lines(path: str, size: int) -> int:
    if (path, size) not in _LINES:
        try:
            with open(path, "rb") as fh:
                _LINES[(path, size)] = fh.read(size).count(b"\n")
        except OSError:
            return 0
    return _LINES[(path, size)]


@dataclass(frozen=True)
class Moment:
    """When a fault strikes: once `value` records or bytes are written, or `value` seconds have passed."""

    unit: str
    value: float

    def reached(self, work: Path, elapsed: float) -> bool:
        if self.unit == "seconds":
            return elapsed >= self.value
        records, size = progress(work)
        return (records if self.unit == "records" else size) >= self.value

    def __str__(self) -> str:
        return f"{self.unit}>={self.value:g}"


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run of a cell: its folder, and the sizes a fault's moment is drawn within."""

    case: Case
    seconds: float
    records: int
    size: int
    largest: int  # the biggest file it wrote: a disk-full limit is drawn below it

    @property
    def timeout(self) -> float:
        """A run taking this long has hung (the CPU is shared: generous)."""
        return max(60.0, 30.0 + 4.0 * self.seconds)


def draw_moment(rng: random.Random, ref: Reference, units: Sequence[str]) -> Moment:
    """A seeded moment strictly inside the reference run (records 1..n-1, bytes 1..size-1, 5-95% of its time)."""
    usable = [u for u in units if u == "seconds" or (ref.records if u == "records" else ref.size) > 1]
    unit = rng.choice(usable or ["seconds"])
    if unit == "seconds":
        return Moment(unit, round(rng.uniform(0.05, 0.95) * ref.seconds, 2))
    top = ref.records if unit == "records" else ref.size
    return Moment(unit, rng.randint(1, top - 1))


def killer(moment: Moment, work: Path) -> Inject:
    """SIGKILL the command's whole process group (workers, JVM, trainer) once the moment has come."""

    def inject(proc: subprocess.Popen, elapsed: float) -> bool:
        if not moment.reached(work, elapsed):
            return False
        os.killpg(proc.pid, signal.SIGKILL)
        return True

    return inject


def child_killer(moment: Moment, work: Path, rng: random.Random, narrow: str, victims: list[str]) -> Inject:
    """SIGKILL one seeded child of the command once the moment has come and a child is there to kill."""

    def inject(proc: subprocess.Popen, elapsed: float) -> bool:
        if not moment.reached(work, elapsed):
            return False
        lines = {pid: command_line(pid) for pid in descendants(proc.pid)}
        ok = sorted(p for p, line in lines.items() if line and "resource_tracker" not in line and narrow in line)
        if not ok:
            return False
        victim = rng.choice(ok)
        kill_pids([victim])
        victims.append(lines[victim][:120])
        return True

    return inject


# --- tearing a file --------------------------------------------------------------------------------------
TEARS = ("cut", "zeros", "junk")


def newest_tearable(work: Path) -> Path | None:
    """The file a kill most likely left half-written: the newest JSONL, or a checkpoint's trainer state."""
    found = [p for p in work.rglob("*.jsonl") if p.stat().st_size]
    found += [p for p in work.rglob("checkpoint-*/trainer_state.json") if p.stat().st_size]
    return max(found, key=lambda p: p.stat().st_mtime_ns, default=None)


def tear(path: Path, rng: random.Random) -> str:
    """Cut the last line at a seeded byte, or overwrite its tail (newline included) with zero bytes or with
    junk: what a write interrupted by a crash leaves. A JSON file that is not JSONL is one line here."""
    data = path.read_bytes()
    start = data.rfind(b"\n", 0, len(data) - 1) + 1 if path.suffix == ".jsonl" else 0
    at = rng.randint(start, len(data) - 1)
    how = rng.choice(TEARS)
    if how == "cut":
        tail = b""
    elif how == "zeros":
        tail = b"\0" * (len(data) - at)
    else:
        tail = bytes(rng.choice([b for b in range(1, 256) if b != 10]) for _ in range(len(data) - at))
    path.write_bytes(data[:at] + tail)
    return f"{how} at byte {at - start} of its last {len(data) - start}"


# --- one fault -------------------------------------------------------------------------------------------
@dataclass
class Fault:
    """One injection: its seeded draws, the runs it made, and what it came to."""

    cell: Cell
    kind: str
    index: int
    seed: int
    case: Case
    ref: Reference
    inputs: Inputs
    wrapper: Path
    rng: random.Random = field(init=False)
    runs: list[Run] = field(default_factory=list)
    moment: str = ""
    notes: list[str] = field(default_factory=list)  # a run that succeeded but logged a traceback (py4j does)
    landed: bool = True  # the fault struck while the command ran (not after it had finished)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def command(self, extra: Sequence[str] = (), fsize: int = 0) -> list[str]:
        """The cell's command into this fault's folder, with extra flags, under a file-size limit if any."""
        args = [*self.cell.argv(self.case), *extra]
        return rir_argv(args, self.wrapper, fsize, self.cell.verdicts)

    def run(self, name: str, argv: list[str], inject: Inject | None = None) -> Run:
        proc, run, start = launch(name, argv, self.case.root)
        self.runs.append(watch(proc, run, start, self.ref.timeout, inject))
        return self.runs[-1]

    def mismatch(self) -> str | None:
        tokens = {str(self.case.work): "<OUT>", str(self.ref.case.work): "<OUT>"}
        tokens |= {str(self.case.root / "rollout"): "<ROLLOUT>", str(self.inputs.rollout): "<ROLLOUT>"}
        return self.cell.check(self.case, self.ref.case, tokens)


def one_line(run: Run) -> bool:
    """The expected way to stop: exit code 2, the last stderr line `rir: error: ...`, no traceback."""
    lines = run.stderr.strip().splitlines()
    return run.code == 2 and bool(lines) and lines[-1].startswith("rir: error:") and "Traceback" not in run.stderr


def describe(run: Run) -> str:
    """Why a run counts as `other`, in a line."""
    if run.timed_out:
        return f"{run.name}: hang, still running after {run.seconds:.0f}s (killed)"
    text = run.stderr
    if "Traceback" in text:
        after = text[text.rfind("Traceback") :].strip().splitlines()
        exc = next((line for line in reversed(after) if line and not line.startswith(" ")), after[-1])
        return f"{run.name}: exit {run.code}, traceback: {exc.strip()[:240]}"
    last = text.strip().splitlines()[-1] if text.strip() else "(no stderr)"
    return f"{run.name}: exit {run.code}: {last[:240]}"


def judge(
    fault: Fault, first: Sequence[Run], rerun: Callable[[], Run] | None = None, always: bool = False
) -> tuple[str, str]:
    """Classify the runs the fault hit: each killed, one-line stopped, or finished cleanly; then (after a
    kill or a stop, or `always`) `rerun` (default: the same command); then the output against the reference."""
    stopped = False
    for run in first:
        if run.killed:
            continue
        if one_line(run):
            stopped = True
        elif run.code != 0 or run.timed_out:
            return "other", describe(run)
    if always or stopped or any(run.killed for run in first):
        again = (rerun or (lambda: fault.run("rerun", fault.command())))()
        if again.code != 0 or again.timed_out:
            return "other", describe(again)
    fault.notes += [describe(r) for r in fault.runs if r.code == 0 and "Traceback" in r.stderr]
    mismatch = fault.mismatch()
    if mismatch:
        return "other", mismatch
    return ("stopped-one-line" if stopped else "resumed"), ""


def same_again(fault: Fault, extra: Sequence[str]) -> Callable[[], Run]:
    return lambda: fault.run("rerun", fault.command(extra))


def fault_kill(fault: Fault) -> tuple[str, str]:
    moment = draw_moment(fault.rng, fault.ref, ("records", "bytes", "seconds"))
    first = fault.run("first", fault.command(), killer(moment, fault.case.work))
    fault.moment, fault.landed = str(moment), first.fired
    return judge(fault, [first], always=True)


def fault_kill_worker(fault: Fault) -> tuple[str, str]:
    """A child dies under the command (its pool's worker, the JVM, the pipeline's trainer); the command
    goes on, and the same command with the same flags is run again if it stopped."""
    extra = fault.cell.worker_argv or ()
    moment = draw_moment(fault.rng, fault.ref, ("records", "seconds"))
    victims: list[str] = []
    first = fault.run(
        "first", fault.command(extra), child_killer(moment, fault.case.work, fault.rng, fault.cell.child, victims)
    )
    fault.moment, fault.landed = f"{moment}: {victims[0] if victims else 'no child to kill'}", first.fired
    return judge(fault, [first], same_again(fault, extra))


def fault_disk_full(fault: Fault) -> tuple[str, str]:
    """Files may not grow past a seeded size below the reference's largest file; the rerun has no limit."""
    limit = fault.rng.randint(256, max(257, fault.ref.largest - 1))
    first = fault.run("first", fault.command(fsize=limit))
    fault.moment = f"RLIMIT_FSIZE={limit} (largest output file {fault.ref.largest})"
    fault.landed = first.code != 0
    return judge(fault, [first])


def fault_torn_input(fault: Fault) -> tuple[str, str]:
    """A run killed after some records, the newest file it wrote torn, then the same command again. For
    build-data, half the draws tear the rollout it reads instead; that rollout is then resumed."""
    if fault.cell.name == "build-data" and fault.rng.random() < 0.5:
        return torn_rollout(fault)
    moment = draw_moment(fault.rng, fault.ref, ("records",))
    first = fault.run("first", fault.command(), killer(moment, fault.case.work))
    target = newest_tearable(fault.case.work)
    if target is None:
        fault.moment, fault.landed = f"{moment}; nothing written to tear", False
        return judge(fault, [first], always=True)
    how = tear(target, fault.rng)
    fault.moment = f"{moment}; tore {target.relative_to(fault.case.work)} ({how})"
    return judge(fault, [first], always=True)


def torn_rollout(fault: Fault) -> tuple[str, str]:
    """build-data on a copy of the rollout whose last episode is torn; then `rir rollout` into the copy
    (it redoes the torn episode) and build-data again must give the reference's datasets."""
    copy = fault.case.root / "rollout"
    shutil.copytree(fault.inputs.rollout, copy, ignore=shutil.ignore_patterns(".rir.lock"))
    how = tear(copy / "episodes-0.jsonl", fault.rng)
    fault.moment = f"tore the rollout's episodes-0.jsonl ({how})"
    first = fault.run("first", fault.command())

    def repair() -> Run:
        resumed = fault.run("rollout", rir_argv([*ROLLOUT, "--out", str(copy)]))
        return resumed if resumed.code != 0 else fault.run("rerun", fault.command())

    return judge(fault, [first], repair, always=True)


def fault_second_writer(fault: Fault) -> tuple[str, str]:
    """The same command twice into one folder, the second a seeded 0-3 s later: one is refused (or finds
    nothing left to do), and nothing is written twice."""
    delay = round(fault.rng.uniform(0.0, 3.0), 2)
    fault.moment = f"second started {delay}s after the first"
    a, run_a, start_a = launch("first", fault.command(), fault.case.root)
    time.sleep(delay)
    b, run_b, start_b = launch("second", fault.command(), fault.case.root)
    fault.runs += [watch(a, run_a, start_a, fault.ref.timeout), watch(b, run_b, start_b, fault.ref.timeout)]
    fault.landed = run_a.seconds > delay  # the first was still running when the second started
    return judge(fault, fault.runs)


INJECT: dict[str, Callable[[Fault], tuple[str, str]]] = {
    "kill": fault_kill,
    "kill-worker": fault_kill_worker,
    "disk-full": fault_disk_full,
    "torn-input": fault_torn_input,
    "second-writer": fault_second_writer,
}


# --- the campaign ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Campaign:
    out: Path
    seed: int
    fast: bool

    @property
    def inputs(self) -> Inputs:
        return Inputs(self.out / "inputs")

    @property
    def wrapper(self) -> Path:
        return self.out / "rir_under_fault.py"


def injection_seed(seed: int, cell: str, kind: str, index: int) -> int:
    """Each injection's own seed: the same (campaign seed, cell, kind, index) draws the same fault."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{cell}/{kind}/{index}".encode()).digest()[:4], "big")


def reference(camp: Campaign, cell: Cell) -> Reference:
    """The uninterrupted run of a cell, computed once and kept under --out/refs."""
    case = Case(camp.out / "refs" / cell.name)
    stored = case.root / "ref.json"
    if stored.exists():
        return Reference(case, **json.loads(stored.read_text()))
    shutil.rmtree(case.root, ignore_errors=True)
    argv = rir_argv(cell.argv(case), camp.wrapper, 0, cell.verdicts)
    proc, run, start = launch("reference", argv, case.root)
    run = watch(proc, run, start, 1800.0)
    if run.code != 0:
        raise SystemExit(f"fault_campaign: the reference run of {cell.name} failed: {describe(run)} ({run.log})")
    records, size = progress(case.work)
    largest = max((p.stat().st_size for p in case.work.rglob("*") if p.is_file()), default=0)
    ref = Reference(case, round(run.seconds, 2), records, size, largest)
    stored.write_text(json.dumps({k: getattr(ref, k) for k in ("seconds", "records", "size", "largest")}) + "\n")
    return ref


def inject(camp: Campaign, cell: Cell, kind: str, index: int, ref: Reference) -> dict[str, Any]:
    """Run one fault in a fresh folder and return its entry of faults.json."""
    seed = injection_seed(camp.seed, cell.name, kind, index)
    case = Case(camp.out / "runs" / cell.name / kind / str(index))
    shutil.rmtree(case.root, ignore_errors=True)
    case.root.mkdir(parents=True)
    fault = Fault(cell, kind, index, seed, case, ref, camp.inputs, camp.wrapper)
    start = time.monotonic()
    try:
        outcome, reason = INJECT[kind](fault)
    except Exception as err:  # the campaign's own failure on this fault: reported, the campaign goes on
        outcome, reason = "other", f"campaign error: {type(err).__name__}: {err}"
    replay = f"python bench/fault_campaign.py --seed {camp.seed} --out {camp.out} --one {cell.name}/{kind}/{index}"
    return {
        "cell": cell.name,
        "kind": kind,
        "index": index,
        "seed": seed,
        "moment": fault.moment,
        "landed": fault.landed,
        "notes": fault.notes,
        "outcome": outcome,
        "reason": reason,
        "seconds": round(time.monotonic() - start, 1),
        "folder": str(case.root),
        "reproduce": replay,
        "runs": [
            {"name": r.name, "argv": r.argv, "code": r.code, "seconds": round(r.seconds, 1), "timed_out": r.timed_out}
            for r in fault.runs
        ],
    }


def plan(camp: Campaign, cells: dict[str, Cell], only: list[str], kinds: list[str], per_cell: int) -> list[tuple]:
    """(cell, kind, index) of every injection, cell by cell."""
    chosen = [cells[name] for name in (only or list(cells)) if not (camp.fast and cells[name].slow)]
    return [(c, k, i) for c in chosen for k in c.kinds() if k in kinds for i in range(per_cell)]


def default_per_cell(cells: dict[str, Cell]) -> int:
    """Faults per (cell, kind): enough for the full campaign to inject MIN_FAULTS."""
    return math.ceil(MIN_FAULTS / sum(len(c.kinds()) for c in cells.values()))


def progress_line(n: int, total: int, entry: dict[str, Any]) -> str:
    what = f"{entry['cell']}/{entry['kind']}/{entry['index']}"
    reason = f": {entry['reason']}" if entry["reason"] else ""
    missed = "" if entry["landed"] else " (struck after the command had finished)"
    return (
        f"[{n:>3}/{total}] {what:<34} {entry['moment'][:70]:<70} -> {entry['outcome']}{reason}{missed} "
        f"({entry['seconds']:.0f}s)"
    )


def table(entries: list[dict[str, Any]], cells: dict[str, Cell]) -> str:
    """Rows: commands; columns: fault kinds; a cell: injected / resumed / stopped-one-line / other."""

    def counts(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "-"
        return " / ".join(str(n) for n in [len(rows), *(sum(r["outcome"] == o for r in rows) for o in OUTCOMES)])

    lines = [f"| command | {' | '.join(KINDS)} | all |", f"| --- |{' ---: |' * (len(KINDS) + 1)}"]
    for name in dict.fromkeys(e["cell"] for e in entries):
        mine = [e for e in entries if e["cell"] == name]
        row = [counts([e for e in mine if e["kind"] == k]) if k in cells[name].kinds() else "n/a" for k in KINDS]
        lines.append(f"| {name} | {' | '.join(row)} | {counts(mine)} |")
    totals = [counts([e for e in entries if e["kind"] == k]) for k in KINDS]
    lines.append(f"| **total** | {' | '.join(totals)} | {counts(entries)} |")
    return "\n".join(lines)


def findings(entries: list[dict[str, Any]]) -> str:
    """Every `other` with its reason and the command that replays it; and the faults that struck late."""
    others = [e for e in entries if e["outcome"] == "other"]
    lines = ["", f"Cells: injected / {' / '.join(OUTCOMES)}.", ""]
    lines += [f"`other` outcomes: {len(others)}" + (":" if others else ".")]
    for e in others:
        lines += [f"- {e['cell']}/{e['kind']}/{e['index']} ({e['moment']}): {e['reason']}", f"  `{e['reproduce']}`"]
    noisy = [e for e in entries if e.get("notes")]
    if noisy:
        lines += ["", "Runs that succeeded but logged a traceback (not counted as `other`):"]
        lines += [f"- {e['cell']}/{e['kind']}/{e['index']}: {'; '.join(e['notes'])}" for e in noisy]
    late = [e for e in entries if not e["landed"]]
    if late:
        names = ", ".join(f"{e['cell']}/{e['kind']}/{e['index']}" for e in late)
        lines += ["", f"{len(late)} fault(s) struck after the command had finished (judged all the same): {names}"]
    seconds = sum(e["seconds"] for e in entries)
    lines += ["", f"{len(entries)} faults in {seconds / 60:.1f} min of runs."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The campaign's flags; the module docstring is its --help."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="campaign seed: every moment, limit and tear derives from it")
    p.add_argument("--out", type=Path, required=True, help="campaign folder (references are kept and reused)")
    p.add_argument("--only", default="", help="comma list of commands (default: all)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of fault kinds (default: {','.join(KINDS)})")
    p.add_argument("--per-cell", type=int, default=0, help="faults per (command, kind) (default: enough for 100)")
    p.add_argument("--fast", action="store_true", help="leave out the slow cells (TextWorld, ScienceWorld)")
    p.add_argument("--one", default="", help="replay one injection, CELL/KIND/INDEX (from the list of `other`s)")
    return p.parse_args(argv)


def selection(args: argparse.Namespace, camp: Campaign, cells: dict[str, Cell]) -> list[tuple]:
    """The injections asked for; unknown names are refused before anything runs."""
    if args.one:
        name, kind, index = (args.one.split("/") + ["", "", ""])[:3]
        if name not in cells or kind not in cells[name].kinds() or not index.isdigit():
            raise SystemExit(f"fault_campaign: --one takes CELL/KIND/INDEX, e.g. eval-builtin/kill/0; not {args.one}")
        return [(cells[name], kind, int(index))]
    only = [n for n in args.only.split(",") if n]
    kinds = [k for k in args.kinds.split(",") if k]
    if bad := [n for n in only if n not in cells] + [k for k in kinds if k not in KINDS]:
        raise SystemExit(f"fault_campaign: unknown {bad}; commands: {list(cells)}; kinds: {list(KINDS)}")
    return plan(camp, cells, only, kinds, args.per_cell or default_per_cell(cells))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the injections one after another (a shared 2-core CPU: never two at once), writing faults.json
    after each, so a campaign stopped midway keeps what it found; exit 1 when any fault ended `other`."""
    args = parse_args(argv)
    camp = Campaign(args.out.expanduser().resolve(), args.seed, args.fast)
    cells = make_cells(camp.inputs)
    todo = selection(args, camp, cells)
    camp.out.mkdir(parents=True, exist_ok=True)
    camp.wrapper.write_text(WRAPPER)
    prepare_inputs(camp.inputs, {c.needs for c, _, _ in todo})
    refs: dict[str, Reference] = {}
    entries: list[dict[str, Any]] = []
    for n, (cell, kind, index) in enumerate(todo, start=1):
        if cell.name not in refs:
            refs[cell.name] = reference(camp, cell)
            print(
                f"reference {cell.name}: {refs[cell.name].seconds:.0f}s, {refs[cell.name].records} records", flush=True
            )
        entries.append(inject(camp, cell, kind, index, refs[cell.name]))
        print(progress_line(n, len(todo), entries[-1]), flush=True)
        if not args.one:
            (camp.out / "faults.json").write_text(json.dumps(entries, indent=1) + "\n")
    report = table(entries, cells) + "\n" + findings(entries)
    if not args.one:
        (camp.out / "table.md").write_text(report + "\n")
    print("\n" + report)
    return 0 if all(e["outcome"] != "other" for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
