"""`rir view`: one self-contained page of a run. Every episode is listed, a restore is an arrow from the
step it left to the checkpoint it restored, the side-by-side view marks the first differing action, and
no text from a trace (or a report) can inject markup or script."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import replace
from html import unescape
from html.parser import HTMLParser
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

from eval.view import render_run
from eval.view.assets import JS
from eval.view.data import first_difference
from rir_runtime.cli import main
from rir_runtime.decisions import Failure, Reflection
from rir_runtime.memory import Anchored, MemorySnapshot
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import (
    EpisodeRecord,
    GuidanceEvent,
    LocateEvent,
    LocateFailedEvent,
    ReflectEvent,
    ResetEvent,
    RespondEvent,
    RestoreEvent,
    RestoreFailedEvent,
    ReviewEvent,
    RollbackCallEvent,
    StepEvent,
    ToolErrorEvent,
    append_record,
    read_records,
)

SCRIPT = "<script>alert(1)</script>"
ATTR = '" onmouseover="x'
QUOTE = "' onfocus='y"
PAYLOADS = (SCRIPT, ATTR, QUOTE)
EVIL = f"{SCRIPT} {ATTR} {QUOTE} \u2028&amp;"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: 4 builtin variations under react and rir (variation 0's rir episode restores)."""
    out = tmp_path_factory.mktemp("view")
    cfg = SelectionConfig(
        env="builtin", tasks=["workshop-3"], variations="0-3", methods=["react", "rir"], error_rate=0.3
    )
    run_jobs(expand_jobs(cfg), out / "episodes.jsonl")
    return out


@pytest.fixture(scope="module")
def records(run: Path) -> list[EpisodeRecord]:
    return read_records(run / "episodes.jsonl")


def blobs(page: str) -> dict[str, Any]:
    """The page's JSON data elements by id."""
    found = re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.DOTALL)
    return {element_id: json.loads(text) for element_id, text in found}


def steps(record: EpisodeRecord) -> list[str]:
    return [e.action for e in record.events if isinstance(e, StepEvent)]


def test_the_page_lists_every_episode_each_in_its_own_data_element(run: Path, records: list[EpisodeRecord]) -> None:
    page = render_run(run).read_text()
    data = blobs(page)
    ids = [row[data["rir-meta"]["columns"].index("episode_id")] for row in data["rir-meta"]["rows"]]
    assert sorted(ids) == sorted(r.episode_id for r in records)
    assert all(r.episode_id in page for r in records)
    assert {f"ep-{i}" for i in range(len(records))} <= data.keys()  # drawn only when opened


def test_a_restore_is_an_arrow_from_the_step_it_left_to_its_checkpoint(run: Path, records: list[EpisodeRecord]) -> None:
    data = blobs(render_run(run).read_text())
    i, record = next((i, r) for i, r in enumerate(records) if any(isinstance(e, RestoreEvent) for e in r.events))
    tree = data[f"ep-{i}"]["tree"]
    restores = [e for e in record.events if isinstance(e, RestoreEvent) and e.k > 0]
    assert [(a["from_t"], a["to_t"]) for a in tree["restores"]] == [(e.t, e.to) for e in restores]
    for arrow in tree["restores"]:
        assert tree["nodes"][arrow["from"]]["t"] == arrow["from_t"]
        assert tree["nodes"][arrow["to"]]["t"] == arrow["to_t"]
    assert len(tree["nodes"]) == 1 + len(steps(record))  # the start, then one node per executed step


def test_side_by_side_marks_the_first_differing_action(run: Path, records: list[EpisodeRecord]) -> None:
    meta = blobs(render_run(run).read_text())["rir-meta"]
    compared = 0
    for group in meta["groups"]:
        a, b = (steps(records[i]) for i in group["members"])
        expected = next((k for k, (x, y) in enumerate(zip_longest(a, b)) if x != y), None)
        assert group["first_diff"] == expected
        compared += expected is not None
    assert compared  # some variation made react and rir act differently


def test_first_difference_counts_an_ended_sequence_as_different() -> None:
    assert first_difference([["a", "b"], ["a", "b"]]) is None
    assert first_difference([["a", "b"], ["a"]]) == 1
    assert first_difference([["a", "b"], ["a", "b"], ["a", "c"]]) == 1
    assert first_difference([["a"]]) is None


def evil_record(record: EpisodeRecord) -> EpisodeRecord:
    """The record with the payloads in every text field, and one event of every kind."""
    failure = Failure(EVIL, EVIL, EVIL, EVIL)
    memory = MemorySnapshot((EVIL,), (EVIL,), (failure,), (EVIL,), (Anchored((EVIL,), EVIL, EVIL),))
    events: list[Any] = []
    for e in record.events:
        if isinstance(e, ResetEvent):
            e = replace(e, observation=EVIL, objective=EVIL)
        elif isinstance(e, StepEvent):
            e = replace(e, action=EVIL + str(e.t), observation=EVIL)
        elif isinstance(e, ReviewEvent):
            e = replace(e, trigger=EVIL, decision=EVIL, reason=EVIL, raw=EVIL)
        elif isinstance(e, ReflectEvent):
            e = replace(e, reflection=Reflection((EVIL,), (EVIL,), failure), memory=memory)
        events.append(e)
    t = events[-1].t
    events += [
        GuidanceEvent(t, EVIL, (EVIL,), (EVIL,), 5.0, EVIL, EVIL + "!", (-1.5,)),
        RollbackCallEvent(t, EVIL, 2),
        ToolErrorEvent(t, EVIL),
        LocateFailedEvent(t, EVIL),
        RestoreFailedEvent(t, 1, EVIL),
        RespondEvent(t, EVIL),
    ]
    return replace(record, task=EVIL, controller=EVIL, method=EVIL, policy=EVIL, stop_reason=EVIL, tag=EVIL,
                   episode_id=EVIL + record.episode_id, memory=memory, events=tuple(events))  # fmt: skip


class Elements(HTMLParser):
    """Every script element (its attributes and text) and every attribute name of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.attributes: list[str] = []
        self._in_script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes += [name for name, _ in attrs]
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = None


def test_no_text_of_a_trace_or_report_escapes_into_markup(run: Path, records: list[EpisodeRecord], tmp_path) -> None:
    with_restore = next(r for r in records if any(isinstance(e, LocateEvent) for e in r.events))
    evil = [evil_record(r) for r in records if r.variation == with_restore.variation]
    with (tmp_path / "episodes.jsonl").open("w") as fh:
        for r in evil:
            append_record(fh, r)
    summary = {"methods": {EVIL: {"episodes": 2, "success_rate": 0.5, "note": EVIL}},
               "paired": [{"a": EVIL, "b": EVIL, "episodes": 2, "significant": EVIL}]}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "report.md").write_text(f"# {EVIL}\n")
    (tmp_path / f"{QUOTE}{ATTR}<img src=x>.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # no "/" in a file name
    page = render_run(tmp_path).read_text()

    for payload in (*PAYLOADS, "<img src=x>"):
        assert payload not in page
    parsed = Elements()
    parsed.feed(page)
    code = [text for attrs, text in parsed.scripts if attrs.get("type") != "application/json"]
    assert code == [JS]  # the page's own script is the only one that runs, and the policy admits it alone
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert policy and f"'sha256-{base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()}'" in unescape(
        policy[1]
    )
    assert "</script" not in JS.lower() and "<!--" not in JS
    data_ids = {attrs.get("id") for attrs, _ in parsed.scripts if attrs.get("type") == "application/json"}
    assert data_ids == {"rir-meta", "ep-0", "ep-1"}
    assert not [name for name in parsed.attributes if name.lower().startswith("on")]

    # Escaped, not lost: the data carries every text intact.
    data = blobs(page)
    episode = next(data[k] for k in ("ep-0", "ep-1") if any(e["kind"] == "reflect" for e in data[k]["events"]))
    kinds = {e["kind"] for e in episode["events"]}
    assert {"reset", "step", "review", "locate", "reflect", "restore", "guidance", "respond", "tool_error"} <= kinds
    step = next(e for e in episode["events"] if e["kind"] == "step")
    assert step["action"].startswith(EVIL) and step["observation"] == EVIL
    reflect = next(e for e in episode["events"] if e["kind"] == "reflect")
    assert reflect["reflection"]["failure"]["lesson"] == EVIL and reflect["memory"]["notes"] == [EVIL]
    guidance = next(e for e in episode["events"] if e["kind"] == "guidance")
    assert guidance["warned"] == [EVIL] and guidance["changed"] is True
    assert data["rir-meta"]["rows"][0][data["rir-meta"]["columns"].index("task")] == EVIL


def test_cli_writes_the_page_and_one_episode_with_its_side_by_side(run: Path, records, tmp_path, capsys) -> None:
    assert main(["view", str(run)]) == 0
    assert (run / "view.html").exists()
    chosen = records[1]
    out = tmp_path / "one.html"
    assert main(["view", str(run), "--episode", chosen.episode_id, "--out", str(out)]) == 0
    meta = blobs(out.read_text())["rir-meta"]
    ids = [row[meta["columns"].index("episode_id")] for row in meta["rows"]]
    assert ids[0] == chosen.episode_id and meta["focus"] == 0
    assert sorted(ids) == sorted(r.episode_id for r in records if r.variation == chosen.variation)


def test_cli_names_an_unknown_episode_and_a_folder_without_episodes(run: Path, tmp_path, capsys) -> None:
    assert main(["view", str(run), "--episode", "builtin/no-such-episode"]) == 2
    err = capsys.readouterr().err
    assert "no episode 'builtin/no-such-episode'" in err and "episode_id" in err and len(err.splitlines()) == 1
    assert main(["view", str(tmp_path)]) == 2
    assert "holds no episodes*.jsonl" in capsys.readouterr().err


def test_cli_names_a_page_path_that_cannot_be_written(run: Path, tmp_path, capsys) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    for out, says in ((tmp_path, "is a folder"), (tmp_path / "a-file" / "view.html", "is a file, not a folder")):
        assert main(["view", str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.splitlines()) == 1


def test_the_report_tables_and_plots_are_embedded(run: Path, tmp_path) -> None:
    for path in run.glob("episodes*.jsonl"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    summary = {"methods": {"rir/heuristic": {"episodes": 4, "success_rate": 0.75}}, "paired": [{"a": "react",
               "b": "rir/heuristic", "episodes": 4, "a_only": 0, "b_only": 2, "p_value": 0.5}]}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "success_rate.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    page = render_run(tmp_path).read_text()
    assert '<td class="name">rir/heuristic</td>' in page and "Paired comparisons" in page
    assert 'src="data:image/png;base64,iVBORw0KGgo=' in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
