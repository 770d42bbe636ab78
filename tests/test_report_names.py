"""The report a person reads first: long method keys show by short labels with a legend of the full keys
(in report.md and in `rir view`'s report, with the full key on hover), and the paired table opens with
the run's headline pair, the room beside it. summary.json keeps the full keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

from eval.names import MAX_NAME, short_names
from eval.report import PairOrder, headline, write_report
from eval.view.page import report_section
from rir_runtime.trace import EpisodeRecord
from tests.factories import episode_record

WHERE_SWAP = "when=heuristic,where=oracle-agent,what=heuristic"  # as a composite controller names itself
WHEN_SWAP = "when=oracle-agent,where=heuristic,what=heuristic"
TUNED = "tuned:runs/controller-textworld-agent-lesson/sft"


def runs(method: str, controller: str, results: str) -> list[EpisodeRecord]:
    """One record per character of `results` ('1' success), variation by position: paired across methods."""
    return [
        episode_record(method=method, controller=controller, variation=i, success=c == "1", episode_id=f"{method}{i}")
        for i, c in enumerate(results)
    ]


def decision_preset() -> list[EpisodeRecord]:
    """A decision preset's rows: react, the heuristic, the oracle-agent (so a room) and two module swaps."""
    return (
        runs("react", "-", "0000000011")
        + runs("rir", "heuristic", "1100000011")
        + runs("rir", "oracle-agent", "1111110011")
        + runs("rir", WHERE_SWAP, "1111100011")
        + runs("rir", WHEN_SWAP, "1110000011")
    )


def table_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("|")]


def pair_rows(report: str) -> list[str]:
    """The paired table's first cells, in order."""
    section = report.split("## Paired differences", 1)[1].split("\n## ", 1)[0]
    return [line.split("|")[1].strip() for line in table_lines(section)[2:]]


def test_labels_are_unique_short_and_read_from_the_parts() -> None:
    keys = ["react", "rir/heuristic", f"rir/{WHERE_SWAP}", f"rir/{WHEN_SWAP}", f"rir/{TUNED}",
            "rir/tuned:runs/another-very-long-folder-of-adapters/sft", "rir/tuned:runs/a-long-adapter-folder-too/sft",
            "self-refine/when=heuristic,where=heuristic,what=heuristic", "self-refine/heuristic",
            "rir/" + "x" * 80]  # fmt: skip
    labels = short_names(keys)
    assert len(set(labels.values())) == len(keys)
    assert all(len(label) <= MAX_NAME for label in labels.values())
    assert labels["react"] == "react" and labels["rir/heuristic"] == "rir/heuristic"  # short keys stay whole
    assert labels[f"rir/{WHERE_SWAP}"] == "rir/where=oracle-agent"  # the modules that are not the heuristic's
    assert labels[f"rir/{WHEN_SWAP}"] == "rir/when=oracle-agent"
    assert labels[f"rir/{TUNED}"] == "rir/tuned:...-textworld-agent-lesson/sft"  # its kind and its folder's end
    assert labels["self-refine/when=heuristic,where=heuristic,what=heuristic"] == "self-refine/heuristic #2"


def test_no_long_key_sits_in_a_table_cell_and_the_legend_names_each_in_full(tmp_path: Path) -> None:
    records = decision_preset() + runs("rir", TUNED, "1111111011")
    summary = write_report(records, {"split": "dev"}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    long_keys = [k for k in summary["methods"] if len(k) > MAX_NAME]
    assert len(long_keys) == 3
    for line in table_lines(report):
        first = line.split("|")[1].strip().strip("*").split("** (")[0]  # a method, or a pair of two
        assert all(len(name) <= MAX_NAME for name in first.split(" vs ")), line
        assert not [k for k in long_keys if k in line]
    labels = short_names(summary["methods"])
    for key in long_keys:
        assert f"- `{labels[key]}`: `{key}`" in report
    assert set(json.loads((tmp_path / "summary.json").read_text())["methods"]) == set(summary["methods"])


def test_the_headline_pair_comes_first_with_the_room_beside_it(tmp_path: Path) -> None:
    (tmp_path / "room").mkdir()
    write_report(decision_preset(), {"split": "dev"}, tmp_path / "room")
    rows = pair_rows((tmp_path / "room" / "report.md").read_text())
    assert rows[0] == "**rir/oracle-agent vs rir/heuristic** (headline, the room)"
    assert len(rows) == 10 and not [r for r in rows[1:] if "**" in r]

    trained = decision_preset() + runs("rir", TUNED, "1111111011")
    (tmp_path / "trained").mkdir()
    write_report(trained, {"split": "dev"}, tmp_path / "trained")
    rows = pair_rows((tmp_path / "trained" / "report.md").read_text())
    assert rows[:2] == [
        "**rir/tuned:...-textworld-agent-lesson/sft vs rir/heuristic** (headline)",
        "**rir/oracle-agent vs rir/heuristic** (room)",
    ]
    against = [r for r in rows[2:] if r.endswith((" vs rir/heuristic", " vs react"))]
    assert rows[2 : 2 + len(against)] == against  # then the pairs against the heuristic or react


def test_without_a_trained_controller_or_a_room_rir_meets_the_best_other_method() -> None:
    summary = {"methods": {"react": {"success_rate": 0.6}, "reflexion/heuristic": {"success_rate": 0.7},
                           "rir/heuristic": {"success_rate": 0.8}, "rir/oracle": {"success_rate": 0.95}}}  # fmt: skip
    top = headline(summary)
    assert top is not None and top[0] == ("rir/heuristic", "reflexion/heuristic")  # the oracle bounds, never contends
    assert headline({"methods": {"react": {"success_rate": 0.6}}}) is None


def test_the_view_shows_the_labels_the_full_keys_on_hover_and_the_same_order(tmp_path: Path) -> None:
    records = decision_preset() + runs("rir", TUNED, "1111111011")
    summary = write_report(records, {"split": "dev"}, tmp_path)
    html = report_section(summary, [])
    labels = short_names(summary["methods"])
    for key, label in labels.items():
        if label != key:
            assert f'<td class="name" title="{key}">{label}</td>' in html
            assert f"<li><b>{label}</b>: {key}</li>" in html
            assert f">{key}<" not in html.replace(f"</b>: {key}</li>", "")  # in the legend and the titles only
    rows = re.findall(r"<tr( class=\"named\")?><td>([^<]*)</td><td[^>]*>([^<]*)</td><td[^>]*>([^<]*)</td>", html)
    order = PairOrder.of(summary)
    named = [(role, a, b) for _, role, a, b in rows if role]
    assert [role for role, _, _ in named] == ["headline", "room"]
    assert [(a, b) for _, a, b in named] == [(labels[a], labels[b]) for a, b in order.named]
    assert rows[0][0] == ' class="named"'
