"""Writes `summary.json` and `report.md` (a table first, then notes) for a set of episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.summary import summarize


def table(summary: dict[str, Any]) -> str:
    rows = ["| method | episodes | success | 95% CI | mean score | agent calls | rollbacks | env steps | wall s |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    ranked = sorted(summary["methods"].items(), key=lambda kv: -kv[1]["success_rate"])
    for name, s in ranked:
        lo, hi = s["success_ci95"]
        rows.append(f"| {name} | {s['episodes']} | {s['success_rate']:.1%} | [{lo:.1%}, {hi:.1%}] | "
                    f"{s['mean_score']:.1f} | {s['agent_calls']:.1f} | {s['rollbacks']:.2f} | "
                    f"{s['env_steps']:.1f} | {s['wall_s']:.2f} |")
    return "\n".join(rows)


def write_report(records: list[dict[str, Any]], config: dict[str, Any], out: Path, title: str = "RIR evaluation") -> dict[str, Any]:
    """Write summary.json and report.md into `out`; returns the summary."""
    summary = summarize(records, config)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    envs = sorted({r["env"] for r in records})
    lines = [f"# {title}", "", f"{len(records)} episodes on {', '.join(envs)}; split `{config.get('split')}`, "
             f"policy `{config.get('policy')}`, budgets B_agent={config.get('budget_agent')}, "
             f"B_rb={config.get('budget_rollback')}.", "", table(summary), ""]
    (out / "report.md").write_text("\n".join(lines))
    return summary
