"""Writes `summary.json` and `report.md` (the table first, then plots and notes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.summary import restore_offsets, summarize


def table(summary: dict[str, Any]) -> str:
    rows = [
        "| method | episodes | success | 95% CI | mean score | agent calls | rollbacks | env steps | wall s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(summary["methods"].items(), key=lambda kv: -kv[1]["success_rate"])
    for name, s in ranked:
        lo, hi = s["success_ci95"]
        rows.append(
            f"| {name} | {s['episodes']} | {s['success_rate']:.1%} | [{lo:.1%}, {hi:.1%}] | "
            f"{s['mean_score']:.1f} | {s['agent_calls']:.1f} | {s['rollbacks']:.2f} | "
            f"{s['env_steps']:.1f} | {s['wall_s']:.2f} |"
        )
    return "\n".join(rows)


def offsets_table(records: list[dict[str, Any]]) -> str:
    offsets = restore_offsets(records)
    if not offsets:
        return ""
    rows = [
        "| method | restores after an injected error | exactly before it | earlier | later |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, values in sorted(offsets.items()):
        n = len(values)
        rows.append(
            f"| {name} | {n} | {sum(v == 0 for v in values) / n:.0%} | {sum(v < 0 for v in values) / n:.0%} "
            f"| {sum(v > 0 for v in values) / n:.0%} |"
        )
    return "\n".join(rows)


def write_report(
    records: list[dict[str, Any]],
    config: dict[str, Any],
    out: Path,
    title: str = "RIR evaluation",
    all_records: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write summary.json and report.md into `out`; returns the summary."""
    summary = summarize(records, config)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    envs = sorted({r["env"] for r in records})
    lines = [
        f"# {title}",
        "",
        f"{len(records)} episodes on {', '.join(envs)}; split `{config.get('split')}`, "
        f"policy `{config.get('policy')}`, budgets B_agent={config.get('budget_agent')}, "
        f"B_rb={config.get('budget_rollback')}.",
        "",
        table(summary),
        "",
    ]
    offsets = offsets_table(records)
    if offsets:
        lines += [
            "## Where restores landed",
            "",
            "Relative to the first injected error of the abandoned branch (known for the error-injected expert).",
            "",
            offsets,
            "",
        ]
    lines += [
        "## Plots",
        "",
        "![success rate](success_rate.png)",
        "![rollbacks](rollbacks.png)",
        "![restore offsets](restore_offsets.png)",
    ]
    if (out / "success_vs_budget.png").exists() and all_records and len(all_records) > len(records):
        lines.append("![success vs budget](success_vs_budget.png)")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary
