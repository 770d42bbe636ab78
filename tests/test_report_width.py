"""`rir view`'s report fits a 1,400 px window: laid out by a real browser (headless Chromium through
Playwright), the page does not scroll sideways on the report and index or on an episode's page, and
every report table fits its box, with the long controller names of a decision preset in the run.
Skipped where Chromium or Playwright is missing (`make browser` installs both)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from eval.report import write_report
from eval.view import render_run
from eval.view.browser import WIDTH, measure, missing
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import append_record

MISSING = missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"needs a browser: {MISSING}")

# A decision preset's controller names, the longest a report shows (given to copies of real rir episodes).
CONTROLLERS = (
    "when=heuristic,where=oracle-agent,what=heuristic",
    "when=oracle-agent,where=heuristic,what=heuristic",
    "when=heuristic,where=value:runs/value-where-shopdb,what=heuristic",
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of a run with react, rir and three long-named rir rows (real builtin episodes, renamed),
    its summary.json and report.md as `rir eval` writes them."""
    out = tmp_path_factory.mktemp("width")
    cfg = SelectionConfig(
        env="builtin", tasks=["workshop-3"], variations="0-3", methods=["react", "rir"], error_rate=0.3
    )
    records = run_jobs(expand_jobs(cfg), out / "base.jsonl")
    rir = [r for r in records if r.method == "rir"]
    records += [replace(r, controller=c, episode_id=f"{r.episode_id}/{c}") for c in CONTROLLERS for r in rir]
    with (out / "episodes.jsonl").open("w") as fh:
        for r in records:
            append_record(fh, r)
    (out / "base.jsonl").unlink()
    write_report(records, {"split": "dev"}, out)
    return render_run(out)


def test_the_report_and_an_episode_page_fit_a_1400_px_window(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    views = measure(page, WIDTH, screenshot=shot)
    assert [w.view for w in views] == ["report", "episode"]
    assert not [w for w in views if w.scrolls], views
    report_tables = [t for t in views[0].tables if t[0] in ("Methods", "Paired comparisons (exact McNemar)")]
    assert len(report_tables) == 2 and all(width <= box for _, width, box in report_tables), report_tables
    assert shot.stat().st_size > 10_000  # a full-page PNG was written
    summary = json.loads((page.parent / "summary.json").read_text())
    assert {f"rir/{c}" for c in CONTROLLERS} <= summary["methods"].keys()  # summary.json keeps the full keys
