"""`rir view` on shopdb: a step shows the SQL of its `query` call and the rows its write changed, a value
from the database (a product named `<script>`) stays escaped, and a record written before steps carried
their changed rows still renders. The changed rows are part of the trace: they round-trip through the
episodes file and the dataset export."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eval.export import DATASET_DIR, SPLIT, export_run, record_from_row
from eval.view import render_run
from eval.view.database import change_text
from rir_runtime.envs.base import ColumnChange, RowChange
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import StepEvent, append_record, read_records
from rir_runtime.trace.events import TraceFormatError, event_from_json

SCRIPT = "<script>alert(1)</script>"
POISONED = f"Blue Hose {SCRIPT}"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real shopdb run: price-change finds the open order lines with a `query`, then reprices them."""
    out = tmp_path_factory.mktemp("view-shopdb")
    cfg = SelectionConfig(env="shopdb", tasks=["price-change"], variations="0-1", methods=["rir"])
    run_jobs(expand_jobs(cfg), out / "episodes.jsonl")
    return out


def episodes(page: str) -> list[dict[str, Any]]:
    """The page's episode data elements, in order."""
    found = re.findall(r'<script type="application/json" id="ep-\d+">(.*?)</script>', page, re.DOTALL)
    return [json.loads(text) for text in found]


def page_steps(page: str) -> list[dict[str, Any]]:
    return [e for ep in episodes(page) for e in ep["events"] if e["kind"] == "step"]


def test_a_query_shows_its_sql_and_a_write_its_changed_rows(run: Path) -> None:
    steps = page_steps(render_run(run).read_text())
    queries = [s for s in steps if s["action"].startswith("query ")]
    assert queries and all(s["sql"] == s["action"].removeprefix("query ") for s in queries)
    assert not [s for s in steps if "sql" in s and not s["action"].startswith("query ")]
    repriced = [s for s in steps if s["action"].startswith("set_line_price ") and "changes" in s]
    assert repriced
    line = repriced[0]["action"].split()[1]
    assert any(re.fullmatch(rf"order_lines line_id={line}: unit_cents \d+ → \d+", c) for c in repriced[0]["changes"])
    assert all("changes" not in s for s in steps if s["action"].startswith(("query ", "get_order ", "send_email ")))


def test_a_poisoned_value_in_the_sql_or_a_changed_row_stays_escaped(run: Path, tmp_path: Path) -> None:
    poison = RowChange("products", "product_id=8", "update", (ColumnChange("name", "Blue Hose", POISONED),))
    record = read_records(run / "episodes.jsonl")[0]
    events = [
        replace(e, action=f"query SELECT * FROM products WHERE name = '{SCRIPT}'", changes=(poison,))
        if isinstance(e, StepEvent) and e.t == 1
        else e
        for e in record.events
    ]
    with (tmp_path / "episodes.jsonl").open("w") as fh:
        append_record(fh, replace(record, events=tuple(events)))
    assert read_records(tmp_path / "episodes.jsonl")[0].events == tuple(events)  # the trace keeps the rows
    page = render_run(tmp_path).read_text()
    assert SCRIPT not in page and "<script>alert" not in page
    step = next(s for s in page_steps(page) if "changes" in s)
    assert step["sql"] == f"SELECT * FROM products WHERE name = '{SCRIPT}'"  # escaped, not lost
    assert step["changes"] == [f"products product_id=8: name Blue Hose → {POISONED}"]


def test_a_record_without_changed_rows_still_renders(run: Path, tmp_path: Path) -> None:
    """Records written before steps carried their rows have no `changes` field: read and drawn as before."""
    lines = (run / "episodes.jsonl").read_text().splitlines()
    old = []
    for line in lines:
        data = json.loads(line)
        data["events"] = [{k: v for k, v in e.items() if k != "changes"} for e in data["events"]]
        old.append(json.dumps(data))
    assert any('"changes"' in line for line in lines) and not any('"changes"' in line for line in old)
    (tmp_path / "episodes.jsonl").write_text("\n".join(old) + "\n")
    steps = page_steps(render_run(tmp_path).read_text())
    assert steps and not [s for s in steps if "changes" in s]
    assert [s for s in steps if "sql" in s]  # the SQL is the action's: old records show it too


def test_inserted_and_deleted_rows_read_as_rows() -> None:
    row = (ColumnChange("order_id", None, "42"), ColumnChange("amount_cents", None, "23859"))
    inserted = RowChange("refunds", "", "insert", row)
    deleted = RowChange("stock", "product_id=1, warehouse_id=2", "delete", (ColumnChange("qty", "5", None),))
    assert change_text(inserted) == "refunds: inserted order_id=42, amount_cents=23859"
    assert change_text(deleted) == "stock product_id=1, warehouse_id=2: deleted qty=5"


def test_a_step_event_without_changes_is_written_as_before() -> None:
    step = StepEvent(1, "refund 42 1.00", "ok", 8.0)
    assert "changes" not in step.to_json()
    with pytest.raises(TraceFormatError, match="column change"):
        event_from_json(
            {
                **step.to_json(),
                "changes": [
                    {"table": "t", "key": "", "op": "insert", "columns": [{"column": 1, "before": None, "after": "2"}]}
                ],
            }
        )


def test_the_changed_rows_round_trip_through_the_dataset_export(run: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    records = read_records(run / "episodes.jsonl")
    assert any(e.changes for r in records for e in r.events if isinstance(e, StepEvent))
    export_run(run, tmp_path, "parquet")
    assert [record_from_row(row) for row in load_from_disk(str(tmp_path / DATASET_DIR))[SPLIT]] == records
