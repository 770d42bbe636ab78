"""`rir export`: a run as Inspect AI logs and as a Hugging Face dataset. The logs read back with Inspect's
own reader and data frames give summary.json's episodes and success rates, the trace's recovery events
appear in order, untrusted text comes back as the same string, and the dataset loads with one row per
episode and rebuilds the records. Inspect AI is an optional extra: its tests skip where it is missing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eval.export import (
    DATASET_DIR,
    INSPECT_DIR,
    PARQUET,
    SPLIT,
    export_run,
    file_stems,
    log_groups,
    record_from_row,
    trace_features,
)
from eval.harness import EvalConfig, evaluate
from rir_runtime.cli import main
from rir_runtime.trace import (
    EpisodeRecord,
    ResetEvent,
    RestoreEvent,
    ReviewEvent,
    StepEvent,
    append_record,
    read_records,
)

SCRIPT = "<script>alert(1)</script>"
JSONISH = '{"type": "restore", "to": 0, "k": 3, "observation": "</script><img src=x onerror=alert(2)>"}'
LONG = f"{SCRIPT} {'x' * 120} {JSONISH}"  # over 100 characters: Inspect stores it as an attachment
RECOVERY = ("review", "locate", "reflect", "restore")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real eval run: 4 builtin variations under react and rir (rir restores on some), with summary.json."""
    out = tmp_path_factory.mktemp("export-run")
    cfg = EvalConfig(
        env="builtin", tasks=["workshop-3"], variations="0-3", methods=["react", "rir"], error_rate=0.3, out=str(out)
    )
    evaluate(cfg)
    return out


@pytest.fixture(scope="module")
def records(run: Path) -> list[EpisodeRecord]:
    return read_records(run / "episodes.jsonl")


@pytest.fixture(scope="module")
def summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def restored(records: list[EpisodeRecord]) -> EpisodeRecord:
    """The run's first episode that went back (a restore with k > 0)."""
    return next(r for r in records if any(isinstance(e, RestoreEvent) and e.k > 0 for e in r.events))


def poisoned(record: EpisodeRecord) -> EpisodeRecord:
    """The record with markup, JSON-looking and long text in every observation, action and review reason."""
    events: list[Any] = []
    for e in record.events:
        if isinstance(e, ResetEvent):
            e = replace(e, observation=JSONISH, objective=SCRIPT)
        elif isinstance(e, StepEvent):
            e = replace(e, action=f"{SCRIPT}{e.t}", observation=LONG if e.t % 2 else JSONISH)
        elif isinstance(e, ReviewEvent):
            e = replace(e, reason=LONG, raw=JSONISH)
        events.append(e)
    return replace(record, events=tuple(events))


@pytest.fixture(scope="module")
def poisoned_run(records: list[EpisodeRecord], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder (episodes only, no config or summary) whose restoring episode carries the payloads."""
    folder = tmp_path_factory.mktemp("poisoned-run")
    with open(folder / "episodes.jsonl", "w") as fh:
        for r in records:
            append_record(fh, poisoned(r) if r is restored(records) else r)
    return folder


# --- Inspect AI --------------------------------------------------------------------------------------
def read_logs(folder: Path) -> dict[str, Any]:
    """Every log of an export folder by its solver (the method key), read by Inspect with attachments resolved."""
    from inspect_ai.log import read_eval_log

    logs = [read_eval_log(str(p), resolve_attachments=True) for p in sorted(folder.glob("*.eval"))]
    return {log.eval.solver: log for log in logs}


def test_inspect_logs_give_the_summary_episodes_and_success_rates(run: Path, summary, tmp_path) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai.analysis import samples_df

    export_run(run, tmp_path, "inspect")
    logs = read_logs(tmp_path / INSPECT_DIR)
    methods = summary["methods"]
    assert set(logs) == set(methods)
    assert len({log.eval.task_id for log in logs.values()}) == len(logs)  # else the viewer lists one, the rest retries
    assert {log.eval.task for log in logs.values()} == {f"{run.name}/{key}" for key in methods}
    for key, log in logs.items():
        assert log.status == "success" and len(log.samples) == methods[key]["episodes"]
        accuracy = log.results.scores[0].metrics["accuracy"].value
        assert round(accuracy, 4) == methods[key]["success_rate"]

    df = samples_df(str(tmp_path / INSPECT_DIR), quiet=True)
    per_method = df.groupby("metadata_method_key")
    assert per_method.size().to_dict() == {k: v["episodes"] for k, v in methods.items()}
    rates = per_method["score_success"].apply(lambda s: round(float((s == "C").mean()), 4)).to_dict()
    assert rates == {k: v["success_rate"] for k, v in methods.items()}


def test_the_trace_is_the_transcript_in_order_with_a_span_per_branch(run: Path, records, tmp_path) -> None:
    pytest.importorskip("inspect_ai")
    export_run(run, tmp_path, "inspect")
    record = restored(records)
    sample = next(s for s in read_logs(tmp_path / INSPECT_DIR)[record.method_key].samples if s.id == record.episode_id)

    infos = [e for e in sample.events if e.event == "info"]
    assert [e.data for e in infos] == [e.to_json() for e in record.events]  # every event, in order, as written
    kinds = [e.source.removeprefix("rir/") for e in infos if e.source.removeprefix("rir/") in RECOVERY]
    assert kinds == [e.type for e in record.events if e.type in RECOVERY] and "restore" in kinds
    restores = [e for e in record.events if isinstance(e, RestoreEvent) and e.k > 0]
    spans = [e.name for e in sample.events if e.event == "span_begin"]
    assert spans == ["branch 1: from the start"] + [
        f"branch {i + 2}: from checkpoint t={e.to}" for i, e in enumerate(restores)
    ]
    notes = [m.metadata["to"] for m in sample.messages if m.role == "system"]
    assert notes == [e.to for e in restores]
    assert sample.scores["success"].value == ("C" if record.success else "I")
    assert sample.metadata["rollbacks"] == record.rollbacks and sample.metadata["budget_agent"] == record.budget_agent


def test_untrusted_text_round_trips_as_text_through_the_inspect_log(poisoned_run: Path, records, tmp_path) -> None:
    pytest.importorskip("inspect_ai")
    export_run(poisoned_run, tmp_path, "all")
    record = poisoned(restored(records))
    sample = next(s for s in read_logs(tmp_path / INSPECT_DIR)[record.method_key].samples if s.id == record.episode_id)

    steps = [e for e in record.events if isinstance(e, StepEvent)]
    users = [m.content for m in sample.messages if m.role == "user"]
    assert users == [SCRIPT, JSONISH] + [e.observation for e in steps]
    assert [m.content for m in sample.messages if m.role == "assistant"] == [e.action for e in steps]
    assert sample.input == SCRIPT
    assert [e.data for e in sample.events if e.event == "info"] == [e.to_json() for e in record.events]


def test_the_inspect_format_without_inspect_names_the_install(run: Path, tmp_path, monkeypatch, capsys) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # an import of it now fails, installed or not
    assert main(["export", str(run), "--format", "all", "--out", str(tmp_path)]) == 2
    assert "inspect-ai==0.3.285" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # checked before anything was written


# --- the Hugging Face dataset ------------------------------------------------------------------------
def test_the_dataset_loads_with_one_row_per_episode_and_rebuilds_the_records(
    run: Path, records, summary, tmp_path
) -> None:
    import pandas as pd
    from datasets import load_from_disk

    assert main(["export", str(run), "--format", "parquet", "--out", str(tmp_path)]) == 0
    dataset = load_from_disk(str(tmp_path / DATASET_DIR))[SPLIT]
    assert dataset.num_rows == len(records) == sum(m["episodes"] for m in summary["methods"].values())
    assert dataset.features == trace_features()
    assert [record_from_row(row) for row in dataset] == records
    table = pd.read_parquet(tmp_path / PARQUET)
    assert table["episode_id"].tolist() == [r.episode_id for r in records]


def test_untrusted_text_round_trips_as_text_through_the_dataset(poisoned_run: Path, records, tmp_path) -> None:
    import pandas as pd
    from datasets import load_from_disk

    export_run(poisoned_run, tmp_path, "parquet")
    record = poisoned(restored(records))
    row = next(r for r in load_from_disk(str(tmp_path / DATASET_DIR))[SPLIT] if r["episode_id"] == record.episode_id)
    assert record_from_row(row) == record
    table = pd.read_parquet(tmp_path / PARQUET).set_index("episode_id")
    observations = [e["observation"] for e in table.loc[record.episode_id, "events"] if e["type"] == "step"]
    assert observations == [e.observation for e in record.events if isinstance(e, StepEvent)]
    assert all(isinstance(o, str) for o in observations) and JSONISH in observations and LONG in observations


def test_rir_push_dataset_takes_the_exported_folder(run: Path, tmp_path) -> None:
    from train.hub import dataset_upload

    export_run(run, tmp_path, "parquet")
    upload = dataset_upload(tmp_path / DATASET_DIR, "someone/rir-episodes")  # what a push would send; sends nothing
    assert {"README.md", "dataset_dict.json", f"{SPLIT}/data-00000-of-00001.arrow"} <= set(upload.files)


# --- grouping -----------------------------------------------------------------------------------------
def test_a_swept_run_gets_a_log_per_budget_and_file_names_stay_apart(records) -> None:
    assert set(log_groups(records)) == {"react", "rir/heuristic"}
    swept = records + [replace(r, budget_agent_spec="1.5x", episode_id=r.episode_id + "b") for r in records]
    groups = log_groups(swept)
    assert len(groups) == 4 and all(len(g) == len(records) // 2 for g in groups.values())
    stems = file_stems(["rir/when=a,where=b", "rir/when=a;where=b", "react"])
    assert list(stems.values()) == ["rir-when-a-where-b", "rir-when-a-where-b-2", "react"]
