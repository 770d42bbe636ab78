"""`rir export`: an eval run in the formats other tools read, so people who evaluate agents can open a RIR
run with their own tools instead of ours.

    rir export runs/eval/presets-builtin --format all --out exports/presets-builtin

writes into `--out`:

- `inspect/<method>[-<controller>].eval`: one Inspect AI log per method and controller (and per B_agent, when
  the run swept it), written with Inspect's own log API, for `inspect view` and `inspect_ai.analysis.samples_df`.
  One sample per episode: the objective as input, the executed turns as chat messages, `success` (C/I) and
  `score` as scores, the record's counts as metadata, and the whole trace as transcript events in order.
- `dataset/`: the episodes as a Hugging Face `DatasetDict` (one `train` split, one row per episode) whose
  features are the trace schema, saved with `save_to_disk`, with a dataset card so `rir push dataset` takes it.
- `episodes.parquet`: the same rows as one Parquet file.

Text from the environment and from models is untrusted. It is handed to each library's writer as a string
and nothing here parses, templates or renders it, so every observation, action and reply reads back as the
same string. The trace stays the source: rir never reads these files back.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import re
import types
import typing
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.summary import SUMMARY
from eval.view import load_records
from rir_runtime.errors import UserInputError
from rir_runtime.trace import (
    EVENT_TYPES,
    EpisodeRecord,
    Event,
    ResetEvent,
    RespondEvent,
    RestoreEvent,
    RollbackCallEvent,
    StepEvent,
    ToolErrorEvent,
)
from rir_runtime.trace.events import type_hints

if TYPE_CHECKING:
    from inspect_ai.event import Event as InspectEvent
    from inspect_ai.log import EvalLog, EvalSample
    from inspect_ai.model import ChatMessage

FORMATS = ("inspect", "parquet", "all")
INSPECT_DIR, DATASET_DIR, PARQUET = "inspect", "dataset", "episodes.parquet"
SPLIT = "train"  # the one split of the dataset: an export holds a run, not a train/test division
# The version `pyproject.toml`'s `inspect` extra names; the logs are written with the one installed.
INSPECT_PIN = "inspect-ai==0.3.285"


def export_run(run: Path, out: Path, fmt: str) -> list[Path]:
    """Write the run folder's episodes in `fmt` (inspect, parquet or all) under `out`; returns the files
    and folders written. Inspect AI is checked before anything is written, so a missing install costs nothing."""
    if fmt not in FORMATS:
        raise UserInputError(f"unknown export format {fmt!r}: pick one of {', '.join(FORMATS)}")
    if fmt in ("inspect", "all"):
        require_inspect()
    records = load_records(run)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if fmt in ("inspect", "all"):
        written += write_inspect_logs(records, run, out / INSPECT_DIR)
    if fmt in ("parquet", "all"):
        written += write_dataset(records, run.resolve().name, out)
    return written


def require_inspect() -> None:
    """Inspect AI is an optional extra: its pins (fsspec, python-dateutil) sit below this project's, so it
    is not installed with the rest; say how to get it instead of failing on an import deep inside."""
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        raise UserInputError(
            f"--format inspect needs Inspect AI: pip install '{INSPECT_PIN}' (the `inspect` extra; it needs "
            "fsspec<=2026.6.0 and python-dateutil<3, below requirements/constraints.txt, so install it in a "
            "separate environment), or export with --format parquet"
        ) from None


# --- Inspect AI logs ------------------------------------------------------------------------------------
def log_groups(records: Iterable[EpisodeRecord]) -> dict[str, list[EpisodeRecord]]:
    """The records of each log: one log per method key (`<method>[/<controller>]`, as summary.json groups
    them), and per B_agent too when the run swept it, so that a log's success rate is one budget's, as the
    summary's is."""
    records = list(records)
    swept = len({r.budget_agent_spec for r in records}) > 1
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        groups[f"{r.method_key} @ B_agent={r.budget_agent_spec}" if swept else r.method_key].append(r)
    return dict(groups)


def file_stems(keys: Sequence[str]) -> dict[str, str]:
    """A file name for each group key: controller names hold `/ = , : ;`, which file names and Inspect's
    `{timestamp}_{task}_{id}` name parsing do not take; a clash after cleaning gets a counter."""
    stems: dict[str, str] = {}
    for key in keys:
        stem = re.sub(r"[^A-Za-z0-9.]+", "-", key).strip("-") or "episodes"
        unique, n = stem, 2
        while unique in stems.values():
            unique, n = f"{stem}-{n}", n + 1
        stems[key] = unique
    return stems


def write_inspect_logs(records: list[EpisodeRecord], run: Path, folder: Path) -> list[Path]:
    """One `.eval` log per group of `log_groups`, written by Inspect's `write_eval_log`."""
    from inspect_ai.log import write_eval_log

    folder.mkdir(parents=True, exist_ok=True)
    groups = log_groups(records)
    times = run_times(run)
    config = read_json(run / "config.json")
    paths = []
    for key, stem in file_stems(list(groups)).items():
        path = folder / f"{stem}.eval"
        write_eval_log(eval_log(key, groups[key], run.resolve().name, config, times), str(path))
        paths.append(path)
    return paths


def run_times(run: Path) -> tuple[datetime, datetime]:
    """(started, completed): the modification times of config.json (rir eval writes it first) and of the
    last episodes file (appended to the end). The trace keeps no clock of its own, so these are the best
    times there are; a copied folder may have lost them."""
    episodes = sorted(run.glob("episodes*.jsonl"))
    end = max(p.stat().st_mtime for p in episodes)
    start = (run / "config.json").stat().st_mtime if (run / "config.json").is_file() else end
    return datetime.fromtimestamp(min(start, end), UTC), datetime.fromtimestamp(end, UTC)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object the run folder may hold (config.json, summary.json); empty when it does not."""
    return json.loads(path.read_text()) if path.is_file() else {}


def stable_id(*parts: str) -> str:
    """An id that is the same on every export of the same run, so two exports of one run name one eval."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:22]


def eval_log(
    key: str, records: list[EpisodeRecord], run_name: str, config: dict[str, Any], times: tuple[datetime, datetime]
) -> EvalLog:
    """The log of one method and controller: the run as an Inspect task, the policy as its model, the
    method and controller as its solver, one sample per episode."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalPlan, EvalPlanStep, EvalSpec, EvalStats

    first = records[0]
    started, completed = times
    spec = EvalSpec(
        eval_id=stable_id(run_name, key),
        run_id=stable_id(run_name),
        created=started.isoformat(),
        task=f"{run_name}/{key}",  # `inspect view` lists logs by task: the method key tells them apart
        task_id=stable_id(run_name, key, "task"),  # one task id for all would list the rest as retries
        task_display_name=f"{run_name}: {key}",
        task_args={"env": first.env, "split": first.split, "method": first.method, "controller": first.controller},
        solver=key,
        tags=sorted({first.env, first.method, first.controller} - {"-"}),
        dataset=EvalDataset(
            name=f"{first.env}/{first.split}", samples=len(records), sample_ids=[r.episode_id for r in records]
        ),
        model=first.policy,
        config=EvalConfig(epochs=1),
        packages=installed_versions("rir", "inspect_ai"),
        metadata={"rir_run": run_name, "rir_group": key, "rir_config": config},
    )
    plan = EvalPlan(
        name="rir",
        steps=[EvalPlanStep(solver=first.method, params={"controller": first.controller, "policy": first.policy})],
    )
    stats = EvalStats(
        started_at=started.isoformat(),
        completed_at=completed.isoformat(),
        model_usage={first.policy: usage(records)},
    )
    samples = [eval_sample(r, started) for r in records]
    return EvalLog(status="success", eval=spec, plan=plan, results=eval_results(records), stats=stats, samples=samples)


def installed_versions(*dists: str) -> dict[str, str]:
    """The versions of the packages that wrote the log, as Inspect records its own."""
    out = {}
    for dist in dists:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def usage(records: Iterable[EpisodeRecord]) -> Any:
    """The agent's tokens (the records count the controller's inside the totals; they are taken out here,
    and kept apart in the sample metadata), as an Inspect `ModelUsage`."""
    from inspect_ai.model import ModelUsage

    records = list(records)
    prompt = sum(r.prompt_tokens - r.controller_prompt_tokens for r in records)
    completion = sum(r.completion_tokens - r.controller_completion_tokens for r in records)
    return ModelUsage(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)


def eval_results(records: list[EpisodeRecord]) -> Any:
    """The log's headline: the success rate as `accuracy` (summary.json's `success_rate`, unrounded) and
    the mean benchmark score."""
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore

    n = len(records)
    rate = sum(r.success for r in records) / n
    mean = sum(r.score for r in records) / n
    return EvalResults(
        total_samples=n,
        completed_samples=n,
        scores=[
            EvalScore(
                name="success",
                scorer="success",
                scored_samples=n,
                metrics={"accuracy": EvalMetric(name="accuracy", value=rate)},
            ),
            EvalScore(
                name="score", scorer="score", scored_samples=n, metrics={"mean": EvalMetric(name="mean", value=mean)}
            ),
        ],
    )


def eval_sample(record: EpisodeRecord, when: datetime) -> EvalSample:
    """One episode as a sample; `when` stamps its events (the trace has no per-event clock)."""
    from inspect_ai.log import EvalSample
    from inspect_ai.scorer import Score

    objective = next((e.objective for e in record.events if isinstance(e, ResetEvent)), "")
    actions = [e.action for e in record.events if isinstance(e, StepEvent)]
    return EvalSample(
        id=record.episode_id,
        epoch=1,
        input=objective,
        target="",  # the environment judges success; there is no reference answer
        messages=sample_messages(record),
        scores={
            "success": Score(
                value="C" if record.success else "I",
                answer=actions[-1] if actions else None,
                explanation=f"stop reason: {record.stop_reason}",
            ),
            "score": Score(value=record.score),
        },
        metadata=sample_metadata(record),
        events=sample_events(record, when),
        model_usage={record.policy: usage([record])},
        total_time=record.wall_s,
        working_time=record.wall_s,
    )


def sample_metadata(record: EpisodeRecord) -> dict[str, Any]:
    """Every scalar field of the record (budgets, agent and controller calls, rollbacks, recoveries, episode
    id, task, variation, seed, ...) under its trace name, plus the method key the logs are grouped by."""
    skip = {"events", "memory"}
    meta = {f.name: getattr(record, f.name) for f in fields(record) if f.name not in skip}
    return {**meta, "method_key": record.method_key}


def sample_messages(record: EpisodeRecord) -> list[ChatMessage]:
    """The turns as a chat: the objective, then each observation as the user's message and each action
    (or final response, or rollback call) as the assistant's, abandoned branches included in time order. A
    restore is a system message naming the checkpoint the world went back to, so the turns after it read
    as a new branch. Each message's metadata names its trace event and `t`."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

    messages: list[ChatMessage] = []
    for e in record.events:
        meta = {"rir_event": e.type, "t": e.t}
        if isinstance(e, ResetEvent):
            messages.append(
                ChatMessageUser(content=e.objective, source="input", metadata={**meta, "part": "objective"})
            )
            messages.append(ChatMessageUser(content=e.observation, metadata=meta))
        elif isinstance(e, StepEvent):
            messages.append(ChatMessageAssistant(content=e.action, model=record.policy, metadata=meta))
            messages.append(ChatMessageUser(content=e.observation, metadata={**meta, "score": e.score}))
        elif isinstance(e, RespondEvent):
            messages.append(ChatMessageAssistant(content=e.text, model=record.policy, metadata=meta))
        elif isinstance(e, RollbackCallEvent):
            messages.append(ChatMessageAssistant(content=e.reason, metadata={**meta, "target": e.target}))
        elif isinstance(e, ToolErrorEvent):
            messages.append(ChatMessageUser(content=e.message, metadata=meta))
        elif isinstance(e, RestoreEvent) and e.k > 0:
            note = f"[rir] restored to checkpoint t={e.to}: the last {e.k} step(s) were undone"
            messages.append(ChatMessageSystem(content=note, metadata={**meta, "to": e.to, "k": e.k}))
    return messages


def sample_events(record: EpisodeRecord, when: datetime) -> list[InspectEvent]:
    """The whole trace in order as transcript events: each branch (from the start, or from the checkpoint a
    restore went back to, until the next restore) one span, and inside it each trace event one `InfoEvent`
    whose source is `rir/<type>` and whose data is the event's own JSON, the fields episodes.jsonl holds:
    a review's verdict and reason, a locate's segments and step, a reflection and the memory after it, a
    restore's checkpoint. A branch ends as `rir_runtime.trace.replay` ends it: at a restore with k > 0."""
    from inspect_ai.event import InfoEvent, SpanBeginEvent, SpanEndEvent

    def begin(span: str, name: str) -> InspectEvent:  # as Inspect's `span()` writes them: inside their own span
        return SpanBeginEvent(id=span, span_id=span, name=name, type="rir-branch", timestamp=when, working_start=0.0)

    def end(span: str) -> InspectEvent:
        return SpanEndEvent(id=span, span_id=span, timestamp=when, working_start=0.0)

    span = "branch-1"
    out = [begin(span, "branch 1: from the start")]
    for e in record.events:
        out.append(InfoEvent(source=f"rir/{e.type}", data=e.to_json(), span_id=span, timestamp=when, working_start=0.0))
        if isinstance(e, RestoreEvent) and e.k > 0:
            branch = int(span.removeprefix("branch-")) + 1
            out += [end(span), begin(f"branch-{branch}", f"branch {branch}: from checkpoint t={e.to}")]
            span = f"branch-{branch}"
    out.append(end(span))
    return out


# --- the Hugging Face dataset ---------------------------------------------------------------------------
_VALUES = {str: "string", int: "int64", float: "float64", bool: "bool"}


def feature_of(hint: Any) -> Any:
    """The `datasets` feature of a trace field's type: scalars as values, `X | None` as X (Arrow columns
    are nullable), tuples as lists, nested dataclasses (reflections, memory) as structs of their fields.
    Derived from the dataclasses, so a field added to the trace is a column without a change here."""
    from datasets import List, Value

    if hint in _VALUES:
        return Value(_VALUES[hint])
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return feature_of(kinds[0])
    elif typing.get_origin(hint) is tuple and len({a for a in args if a is not Ellipsis}) == 1:
        return List(feature_of(args[0]))
    elif is_dataclass(hint) and isinstance(hint, type):
        hints = type_hints(hint)
        return {f.name: feature_of(hints[f.name]) for f in fields(hint)}
    raise TypeError(f"no Hugging Face feature for the trace type {hint!r}: teach eval/export.py:feature_of it")


def event_columns() -> dict[str, Any]:
    """One struct for every event kind: `type` and the union of their fields, each typed once (a field two
    kinds share, like `observation` or `to`, has one type in both). A field another kind lacks is null."""
    columns: dict[str, Any] = {"type": feature_of(str)}
    for cls in EVENT_TYPES.values():
        hints = type_hints(cls)
        for f in fields(cls):
            feature = feature_of(hints[f.name])
            if columns.setdefault(f.name, feature) != feature:
                raise TypeError(f"event field {f.name!r} has two types across kinds: {columns[f.name]} and {feature}")
    return columns


def trace_features() -> Any:
    """The features of one row: `schema` (the trace schema version) and every `EpisodeRecord` field, the
    events as a list of `event_columns` structs."""
    from datasets import Features, List

    hints = type_hints(EpisodeRecord)
    columns: dict[str, Any] = {"schema": feature_of(int)}
    for f in fields(EpisodeRecord):
        columns[f.name] = List(event_columns()) if f.name == "events" else feature_of(hints[f.name])
    return Features(columns)


def dataset_row(record: EpisodeRecord, event_keys: Sequence[str]) -> dict[str, Any]:
    """A record's JSON line (`EpisodeRecord.to_json`) with every event holding every event column."""
    row = record.to_json()
    row["events"] = [{k: e.get(k) for k in event_keys} for e in row["events"]]
    return row


def record_from_row(row: dict[str, Any]) -> EpisodeRecord:
    """The record a row was made from (`dataset_row`'s inverse): each event keeps its own kind's fields."""
    kinds: dict[str, type[Event]] = EVENT_TYPES
    events = [
        {k: v for k, v in e.items() if k == "type" or k in {f.name for f in fields(kinds[e["type"]])}}
        for e in row["events"]
    ]
    return EpisodeRecord.from_json({**row, "events": events})


def write_dataset(records: list[EpisodeRecord], run_name: str, out: Path) -> list[Path]:
    """The episodes as a saved `DatasetDict` (one split; `datasets.load_from_disk` reads it) with the dataset
    card `rir push dataset` needs, and as one Parquet file for pandas, DuckDB and the like."""
    from datasets import Dataset, DatasetDict

    features = trace_features()
    keys = list(features["events"].feature)
    dataset = Dataset.from_list([dataset_row(r, keys) for r in records], features=features)
    folder = out / DATASET_DIR
    DatasetDict({SPLIT: dataset}).save_to_disk(str(folder))
    (folder / "README.md").write_text(dataset_card(run_name, records))
    dataset.to_parquet(str(out / PARQUET))
    return [folder, out / PARQUET]


def dataset_card(run_name: str, records: list[EpisodeRecord]) -> str:
    """The README of the saved dataset: front matter naming its split's files (the Hub reads the folder as
    it is), then what a row is."""
    from data_gen.cards import dataset_metadata, front_matter

    envs = sorted({r.env for r in records})
    metadata = dataset_metadata(
        {SPLIT: len(records)}, pretty_name=f"RIR episodes: {run_name}", tags=["episodes", *envs]
    )
    return "\n".join(
        [
            front_matter(metadata),
            f"# RIR episodes: {run_name}",
            "",
            f"{len(records)} episodes of a RIR eval run (`rir export`), one row per episode: its outcome, costs, "
            "budgets and full event trace (trace schema in `schema`; see docs/contracts.md of the rir project). "
            f"Summary of the run: `{SUMMARY}` in the run folder.",
            "",
        ]
    )
