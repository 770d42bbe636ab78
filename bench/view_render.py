"""How long `rir view` takes to render a run, and how big the page gets: 100 and 10,000 episodes.

    python bench/view_render.py                       # 100 and 10,000 episodes
    python bench/view_render.py --sizes 100,1000,10000 --keep /tmp/view-bench

Runs real builtin episodes once (workshop-3, 50 variations, react and rir with the noisy expert: 100
records in seconds), then replicates them with new seeds and episode ids to each size (each replica
keeps react and rir paired, so every episode has its side-by-side group), writes each run folder with
its summary.json, report and plots as `rir eval` would, and times reading the records, building the
page and writing it. Prints a table of seconds and megabytes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from eval.report import write_report
from eval.view import load_records, render, render_run
from eval.view.page import report_section
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import EpisodeRecord, append_record


def base_records(out: Path) -> list[EpisodeRecord]:
    """100 real episodes: 50 builtin variations under react and rir (heuristic controller)."""
    cfg = SelectionConfig(
        env="builtin", tasks=["workshop-3"], variations="0-49", methods=["react", "rir"], policy="noisy-expert"
    )
    return run_jobs(expand_jobs(cfg), out / "base" / "episodes.jsonl", desc="base episodes")


def replicate(records: list[EpisodeRecord], n: int) -> list[EpisodeRecord]:
    """`n` records: copies of `records` under seeds 0, 1, 2, ... (ids follow the seed)."""
    out: list[EpisodeRecord] = []
    seed = 0
    while len(out) < n:
        for r in records[: n - len(out)]:
            out.append(replace(r, seed=seed, episode_id=r.episode_id.rsplit("/s", 1)[0] + f"/s{seed}"))
        seed += 1
    return out


def write_run(records: list[EpisodeRecord], folder: Path) -> None:
    """A run folder as `rir eval` leaves it: episodes.jsonl, summary.json, report.md and plots."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "episodes.jsonl").open("w") as fh:
        for r in records:
            append_record(fh, r)
    write_report(records, {"env": "builtin", "bench": "view_render"}, folder, title="view_render bench")


def measure(folder: Path) -> dict[str, float]:
    """Seconds to read, render and write the page (the phases of `render_run`), and the total by itself."""
    t0 = time.perf_counter()
    records = load_records(folder)
    t1 = time.perf_counter()
    report = report_section(json.loads((folder / "summary.json").read_text()), sorted(folder.glob("*.png")))
    parts = render(records, "bench", str(folder), report, None)
    t2 = time.perf_counter()
    out = folder / "view.html"
    with out.open("w", encoding="utf-8") as fh:
        fh.writelines(parts)
    t3 = time.perf_counter()
    del parts
    start = time.perf_counter()
    render_run(folder)
    total = time.perf_counter() - start
    return {"read": t1 - t0, "render": t2 - t1, "write": t3 - t2, "total": total, "mb": out.stat().st_size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,10000", help="comma list of episode counts")
    parser.add_argument("--keep", default="", help="write the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        base = base_records(root)
        print(f"{'episodes':>9} {'read s':>8} {'render s':>9} {'write s':>8} {'total s':>8} {'HTML MB':>8}")
        for n in (int(s) for s in args.sizes.split(",")):
            folder = root / f"n{n}"
            write_run(replicate(base, n), folder)
            m = measure(folder)
            print(f"{n:>9} {m['read']:>8.2f} {m['render']:>9.2f} {m['write']:>8.2f} {m['total']:>8.2f} {m['mb']:>8.1f}")


if __name__ == "__main__":
    main()
