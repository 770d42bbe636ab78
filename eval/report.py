"""Writes `summary.json` and `report.md` (the table first, then plots and notes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.paired import ALPHA, PairedComparison, find_comparison
from eval.summary import SUMMARY, restore_offsets, summarize
from rir_runtime.trace import EpisodeRecord

# The plots `eval.plots` draws, by file; the report shows those that were drawn (a failed one is skipped).
PLOTS = {
    "success_rate.png": "success rate",
    "rollbacks.png": "rollbacks",
    "restore_offsets.png": "restore offsets",
    "success_vs_budget.png": "success vs budget",
}
BASELINE = "react"  # the method without recovery: what every other row is compared to when it ran


def reference_method(summary: dict[str, Any]) -> str | None:
    """The row the main table compares against: react (no recovery) when it ran, else the best method."""
    methods = summary.get("methods", {})
    if not methods:
        return None
    return BASELINE if BASELINE in methods else max(methods, key=lambda k: methods[k]["success_rate"])


def versus_cell(summary: dict[str, Any], name: str, reference: str) -> str:
    """`+12.5 pts (p=0.031)*`: the paired difference of `name` minus `reference` and its McNemar p-value."""
    if name == reference:
        return "ref"
    c = find_comparison(summary, name, reference)
    if c is None or c.episodes == 0:
        return "n/a"
    return f"{c.diff * 100:+.1f} pts (p={c.p_value:.3g}){'*' if c.significant else ''}"


def table(summary: dict[str, Any]) -> str:
    """The main table; with paired tests in the summary, a column compares each row to react (or the best)."""
    reference = reference_method(summary) if "paired" in summary else None
    versus = f" vs {reference} |" if reference else ""
    rows = [
        "| method | episodes | success | 95% CI |" + versus + " mean score | agent calls | controller calls (s) "
        "| recoveries (rollbacks) | env steps | wall s |",
        "| --- | ---: | ---: | --- |" + (" ---: |" if reference else "") + " ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(summary["methods"].items(), key=lambda kv: -kv[1]["success_rate"])
    for name, s in ranked:
        lo, hi = s["success_ci95"]
        cell = f" {versus_cell(summary, name, reference)} |" if reference else ""
        rows.append(
            f"| {name} | {s['episodes']} | {s['success_rate']:.1%} | [{lo:.1%}, {hi:.1%}] |{cell} "
            f"{s['mean_score']:.1f} | {s['agent_calls']:.1f} | {_controller_calls(s)} | {_recoveries(s)} | "
            f"{s['env_steps']:.1f} | {s['wall_s']:.2f} |"
        )
    return "\n".join(rows)


def _controller_calls(s: dict[str, Any]) -> str:
    """The controller's model calls per episode and their seconds; `-` where records predate them."""
    calls = s.get("controller_calls")
    if calls is None:
        return "-"
    return f"{calls:.1f} ({s.get('controller_seconds', 0.0):.1f})"


def accounting_note(summary: dict[str, Any]) -> str:
    """One sentence on who paid for the controller's model calls, since it changes what a budget buys."""
    charged = {s.get("charge_controller") for s in summary.get("methods", {}).values()}
    if charged == {True}:
        return "Controller model calls were charged to B_agent (`--charge_controller`): a call cost the agent a step."
    if charged == {False}:
        bound = summary.get("config", {}).get("budget_controller")
        limit = f"bounded by B_ctrl={bound}" if bound is not None else "unbounded"
        return f"Controller model calls were counted apart from B_agent ({limit}); agent calls are the agent's own."
    return "Rows differ in who paid for controller calls: compare them with care."


def _recoveries(s: dict[str, Any]) -> str:
    """Recoveries per episode (k = 0 included), rollbacks in brackets; older summaries have rollbacks only."""
    if "recoveries" not in s:
        return f"- ({s['rollbacks']:.2f})"
    return f"{s['recoveries']:.2f} ({s['rollbacks']:.2f})"


def paired_table(summary: dict[str, Any]) -> str:
    """Every pair of methods, the better one first, most significant first."""
    comparisons = [PairedComparison.from_dict(e) for e in summary.get("paired", [])]
    if not comparisons:
        return ""
    oriented = [c if c.a_only >= c.b_only else c.swapped() for c in comparisons]
    rows = [
        "| pair (a vs b) | paired episodes | a only | b only | difference | p |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in sorted(oriented, key=lambda c: (c.p_value, c.a, c.b)):
        mark = "*" if c.significant else ""
        rows.append(
            f"| {c.a} vs {c.b} | {c.episodes} | {c.a_only} | {c.b_only} | {c.diff * 100:+.1f} pts | "
            f"{c.p_value:.3g}{mark} |"
        )
    return "\n".join(rows)


def room_table(summary: dict[str, Any]) -> str:
    """Per grid cell (all episodes, then each task): react, the heuristic, the two oracles and the room,
    oracle-agent minus heuristic, with its paired counts and exact McNemar p."""
    rows = summary.get("room", [])
    if not rows:
        return ""

    def rate(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    lines = [
        "| method | cell | episodes | react | heuristic | oracle (V_expert) | oracle-agent (V_agent) | room | "
        "agent-oracle only | heuristic only | p | heuristic When, oracle-agent Where | the same, fresh draws | "
        "oracle-agent, fresh draws |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mark = "*" if r["significant"] else ""
        lines.append(
            f"| {r['method']} | {r['scope']} | {r['episodes']} | {rate(r['react'])} | {rate(r['heuristic'])} | "
            f"{rate(r['oracle_expert'])} | {rate(r['oracle_agent'])} | {r['diff'] * 100:+.1f} pts | {r['a_only']} | "
            f"{r['b_only']} | {r['p_value']:.3g}{mark} | {rate(r.get('oracle_agent_where'))} | "
            f"{rate(r.get('oracle_agent_where_fresh'))} | {rate(r.get('oracle_agent_fresh'))} |"
        )
    return "\n".join(lines)


def offsets_table(records: list[EpisodeRecord]) -> str:
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


PAIRED_NOTE = (
    "Exact McNemar test on the episodes both methods ran (same task, variation, seed and budgets): a "
    'two-sided binomial test on the pairs where exactly one method succeeded. "a only": the first method '
    f"succeeded and the second failed. `*`: p < {ALPHA}, not corrected for the number of pairs."
)
ROOM_NOTE = (
    "`oracle-agent` recovers where continuations of this very agent say a recovery (its lesson kept) "
    "beats going on, to the best checkpoint: what a perfect When and Where could do for this agent. The "
    "room is its success minus the heuristic's on the same episodes; `oracle` values by the expert's plan "
    "instead. The last three columns: the heuristic's When with the oracle-agent's Where (controller "
    "`when=heuristic;where=oracle-agent;what=heuristic`, where it ran), how much of the room is the Where's. "
    "The oracle-agent plays the agent's own future, its luck included; the next values that Where by fresh "
    "draws of the agent's noise (`where=oracle-agent:<K>`), the bound for a Where that reads the trajectory; "
    "the last, the whole oracle-agent so valued (`oracle-agent:<K>`, When and Where): a reference without the "
    f"luck, not a strict bound, since K draws can misjudge continuing. `*`: p < {ALPHA}."
)
OFFSETS_NOTE = "Relative to the first injected error of the abandoned branch (known for the error-injected expert)."


def write_report(
    records: list[EpisodeRecord],
    config: dict[str, Any],
    out: Path,
    title: str = "RIR evaluation",
    all_records: list[EpisodeRecord] | None = None,
) -> dict[str, Any]:
    """Write summary.json and report.md into `out`; returns the summary."""
    summary = summarize(records, config)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    envs = sorted({r.env for r in records})
    lines = [
        f"# {title}",
        "",
        f"{len(records)} episodes on {', '.join(envs)}; split `{config.get('split')}`, "
        f"policy `{config.get('policy')}`, budgets B_agent={config.get('budget_agent')}, "
        f"B_rb={config.get('budget_rollback')}. {accounting_note(summary)}",
        "",
        table(summary),
        "",
    ]
    lines += section("Paired differences", PAIRED_NOTE, paired_table(summary))
    lines += section("Room for a better controller", ROOM_NOTE, room_table(summary))
    lines += section("Where restores landed", OFFSETS_NOTE, offsets_table(records))
    lines += plot_lines(out, swept=bool(all_records and len(all_records) > len(records)))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary


def section(title: str, note: str, body: str) -> list[str]:
    """A report section's lines: its title, what it shows, its table; none where the table is empty."""
    return [f"## {title}", "", note, "", body, ""] if body else []


def plot_lines(out: Path, swept: bool) -> list[str]:
    """The plots written next to the report; the budget plot only where this run `swept` budgets."""
    plots = [name for name in PLOTS if (out / name).exists()]
    if "success_vs_budget.png" in plots and not swept:
        plots.remove("success_vs_budget.png")  # a sweep's plot left by an earlier run of the folder
    return ["## Plots", "", *(f"![{PLOTS[name]}]({name})" for name in plots)] if plots else []
