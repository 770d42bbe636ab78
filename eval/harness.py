"""`rir run` (one episode with a transcript) and `rir eval` (methods x controllers x tasks x seeds
at fixed budgets, optionally swept over the agent-call budget).

`rir eval` writes into `--out`: `episodes.jsonl` (append-only, resumable), `summary.json`,
`report.md`, PNG plots, and the resolved `config.json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eval.report import write_report
from rir_runtime.budgets import AgentBudget
from rir_runtime.orchestration.jobs import EpisodeJob, SelectionConfig, check_nonempty, expand_jobs, run_job, run_jobs
from rir_runtime.trace import EpisodeRecord
from rir_runtime.trace.transcript import render_transcript


@dataclass
class EvalConfig(SelectionConfig):
    budget_sweep: list[str] | None = field(
        default=None,
        metadata={
            "help": "comma list of agent budgets to sweep, absolute (10,20,40) or relative (1x,1.5x,2x); "
            "each runs the whole selection; empty: off"
        },
    )
    title: str = field(default="RIR evaluation", metadata={"help": "report title"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget_sweep is not None:
            if not self.budget_sweep:
                raise ValueError("budget_sweep has no points: list budgets like 10,20,40, or drop the key")
            self.budget_sweep = [str(AgentBudget.parse(b)) for b in self.budget_sweep]


def run_one(cfg: SelectionConfig) -> EpisodeRecord:
    """Run the first episode of the selection and print its transcript."""
    jobs = expand_jobs(replace(cfg, seeds=cfg.seeds[:1], methods=cfg.methods[:1], controller=cfg.controller[:1]))
    check_nonempty(jobs)
    record = run_job(jobs[0])
    print(render_transcript(record))
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "episode.json").write_text(json.dumps(record.to_json(), indent=1) + "\n")
        (out / "transcript.txt").write_text(render_transcript(record) + "\n")
    return record


def eval_jobs(cfg: EvalConfig) -> list[EpisodeJob]:
    if not cfg.budget_sweep:
        return expand_jobs(cfg)
    return [
        job for budget in cfg.budget_sweep for job in expand_jobs(replace(cfg, budget_agent=budget, budget_sweep=None))
    ]


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Run every episode of the selection (resuming), then write summary, report and plots."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    config = asdict(cfg)
    saved = out / "config.json"
    if saved.exists() and json.loads(saved.read_text()) != config:
        print(f"note: {saved} differs from this config; episodes already recorded are kept", file=sys.stderr)
    saved.write_text(json.dumps(config, indent=2) + "\n")
    jobs = eval_jobs(cfg)
    check_nonempty(jobs)
    wanted = {j.episode_id for j in jobs}
    records = run_jobs(
        jobs,
        out / "episodes.jsonl",
        cfg.workers,
        cfg.concurrency,
        desc="eval",
        executor=cfg.executor,
        ray_address=cfg.ray_address,
    )
    records = [r for r in records if r.episode_id in wanted]
    from eval.plots import write_plots  # matplotlib is slow to import: only when plotting

    write_plots(records, out, sweep=bool(cfg.budget_sweep))
    # the table is at one budget: the largest of a sweep
    reference = (
        max(cfg.budget_sweep, key=lambda b: AgentBudget.parse(b).amount) if cfg.budget_sweep else cfg.budget_agent
    )
    at_budget = [r for r in records if r.budget_agent_spec == reference]
    summary = write_report(at_budget, {**config, "budget_agent": reference}, out, title=cfg.title, all_records=records)
    print(f"wrote {out / 'summary.json'}, {out / 'report.md'} and plots", file=sys.stderr)
    return summary
