"""`rir run` (one episode with a transcript) and `rir eval` (methods x tasks x seeds at fixed budgets).

`rir eval` writes `episodes.jsonl` (append-only, resumable), `summary.json`, `report.md` and the
resolved config `config.json` into `--out`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from eval.report import write_report
from rir_runtime.jobs import SelectionConfig, check_nonempty, expand_jobs, run_job, run_jobs
from rir_runtime.transcript import render_transcript


def run_one(cfg: SelectionConfig) -> dict[str, Any]:
    """Run the first episode of the selection and print its transcript."""
    jobs = expand_jobs(replace(cfg, seeds=cfg.seeds[:1], methods=cfg.methods[:1]))
    check_nonempty(jobs)
    record = run_job(jobs[0])
    print(render_transcript(record))
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "episode.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / "transcript.txt").write_text(render_transcript(record) + "\n")
    return record


def evaluate(cfg: SelectionConfig) -> dict[str, Any]:
    """Run every episode of the selection (resuming), then write the summary and report."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    config = asdict(cfg)
    saved = out / "config.json"
    if saved.exists() and json.loads(saved.read_text()) != config:
        print(f"note: {saved} differs from this config; episodes already recorded are kept", file=sys.stderr)
    saved.write_text(json.dumps(config, indent=2) + "\n")
    jobs = expand_jobs(cfg)
    check_nonempty(jobs)
    wanted = {j.episode_id for j in jobs}
    records = [r for r in run_jobs(jobs, out / "episodes.jsonl", cfg.workers, cfg.concurrency, desc="eval") if r["episode_id"] in wanted]
    summary = write_report(records, config, out)
    print(f"wrote {out / 'summary.json'} and {out / 'report.md'}", file=sys.stderr)
    return summary
