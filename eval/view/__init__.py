"""`rir view`: a run folder as one self-contained HTML page, to read episodes as trees instead of JSONL.

    rir view runs/eval/presets-builtin                       # -> runs/eval/presets-builtin/view.html
    rir view runs/eval/presets-builtin --episode ID --out one.html

The page holds the report (summary.json's tables, the folder's plots), an index of every episode
(filtered in the browser by method, controller, task and outcome), and one page per episode, drawn
only when opened: its branch tree with the restores as arrows back to their checkpoints, its timeline
(steps, with a database env's SQL and changed rows; reviews, locates, reflections with the memory after
them, restores, guidance), and the same episode under every other method and controller of the run,
side by side, with the first action where they differ marked. Records are read through the typed trace
(`read_records`, `replay`).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from eval.paired import pairing_key
from eval.summary import SUMMARY
from eval.view.data import INDEX_COLUMNS, episode_view, groups, index_row
from eval.view.page import json_script, page, report_section
from rir_runtime.errors import UserInputError
from rir_runtime.trace import EpisodeRecord, read_records

__all__ = ["load_records", "main", "render", "render_run", "select_episode"]


def load_records(run: Path) -> list[EpisodeRecord]:
    """Every record of a folder written by `rir eval` (one episodes.jsonl) or `rir rollout` (one per shard)."""
    if not run.is_dir():
        raise UserInputError(f"{run} is not a folder: pass a run folder written by rir eval or rir rollout")
    paths = sorted(run.glob("episodes*.jsonl"))
    if not paths:
        raise UserInputError(f"{run} holds no episodes*.jsonl: pass a run folder written by rir eval or rir rollout")
    records = [r for path in paths for r in read_records(path)]
    if not records:
        raise UserInputError(f"{run}'s episodes files hold no episodes yet: let the run finish an episode first")
    return records


def select_episode(records: list[EpisodeRecord], episode_id: str) -> list[EpisodeRecord]:
    """The episode named, first, then the same episode under the run's other methods and controllers."""
    chosen = next((r for r in records if r.episode_id == episode_id), None)
    if chosen is None:
        ids = [r.episode_id for r in records]
        close = difflib.get_close_matches(episode_id, ids, n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else f" The run's first id is '{ids[0]}'."
        raise UserInputError(
            f"no episode '{episode_id}' in this run.{hint} Pass an id from the page's index or the episode_id "
            "field of episodes*.jsonl"
        )
    key = pairing_key(chosen)
    return [chosen] + [r for r in records if r is not chosen and pairing_key(r) == key]


def render(records: list[EpisodeRecord], title: str, subtitle: str, report: str, focus: int | None) -> list[str]:
    """The page's pieces for these records (`focus`: the episode the page opens on)."""
    of, groups_ = groups(records)
    meta: dict[str, Any] = {
        "columns": list(INDEX_COLUMNS),
        "rows": [index_row(r, of[i]) for i, r in enumerate(records)],
        "groups": groups_,
        "focus": focus,
    }
    episodes = (json_script(f"ep-{i}", episode_view(r, i, of[i])) for i, r in enumerate(records))
    return list(page(title, subtitle, report, meta, episodes))


def render_run(run: Path, episode: str | None = None, out: Path | None = None) -> Path:
    """Write the page of a run folder (or of one episode and its side-by-side); returns where."""
    records = load_records(run)
    out = out or run / "view.html"
    if episode is not None:
        records = select_episode(records, episode)
        report, focus = "", 0
    else:
        report, focus = report_section(_summary(run), sorted(run.glob("*.png"))), None
    parts = render(records, _title(run), str(run), report, focus)
    _check_page_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        fh.writelines(parts)
    return out


def _check_page_path(out: Path) -> None:
    """A page path that cannot be written (a folder, or under a file) is the user's to fix, not a traceback."""
    if out.is_dir():
        raise UserInputError(f"--out {out} is a folder: give the page's file name, e.g. {out / 'view.html'}")
    blocked = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise UserInputError(f"--out {out}: {blocked} is a file, not a folder: choose another --out")


def _summary(run: Path) -> dict[str, Any] | None:
    """summary.json of `rir eval`, if the folder has one (a rollout folder has none)."""
    path = run / SUMMARY
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path} is not valid JSON ({err.msg}): rerun rir eval to rewrite it") from None
    return data if isinstance(data, dict) else None


def _title(run: Path) -> str:
    """report.md's heading when there is one, else the folder's name."""
    report = run / "report.md"
    if report.exists():
        for line in report.read_text().splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return f"RIR run {run.name}"


def main(run: str, episode: str | None = None, out: str | None = None) -> int:
    path = render_run(Path(run), episode, Path(out) if out else None)
    size = path.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    print(f"wrote {path} ({shown}); open it in a browser")
    return 0
