"""Writes `summary.json` and `report.md` (the table first, then plots and notes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.names import controller_spec, legend, summary_names
from eval.paired import ALPHA, PairedComparison, find_comparison
from eval.summary import ROOM_BASE, ROOM_BOUND, SUMMARY, restore_offsets, summarize
from rir_runtime.trace import EpisodeRecord

# The plots `eval.plots` draws, by file; the report shows those that were drawn (a failed one is skipped).
PLOTS = {
    "success_rate.png": "success rate",
    "rollbacks.png": "rollbacks",
    "restore_offsets.png": "restore offsets",
    "success_vs_budget.png": "success vs budget",
}
BASELINE = "react"  # the method without recovery: what every other row is compared to when it ran
RIR = "rir"  # the method whose best controller the headline sets against the best other method
Pair = tuple[str, str]


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
    """The main table; with paired tests in the summary, a column compares each row to react (or the best).
    Long method keys show by their short labels, listed under the table with the full keys (`names_legend`)."""
    labels = summary_names(summary)
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
            f"| {labels[name]} | {s['episodes']} | {s['success_rate']:.1%} | [{lo:.1%}, {hi:.1%}] |{cell} "
            f"{s['mean_score']:.1f} | {s['agent_calls']:.1f} | {_controller_calls(s)} | {_recoveries(s)} | "
            f"{s['env_steps']:.1f} | {s['wall_s']:.2f} |"
        )
    return "\n".join(rows + names_legend(labels))


def names_legend(labels: dict[str, str]) -> list[str]:
    """The lines under the main table that give each shortened label its full key (none when none is)."""
    shortened = legend(labels)
    if not shortened:
        return []
    return ["", LEGEND_NOTE, "", *(f"- `{label}`: `{key}`" for label, key in shortened)]


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
    """Every pair of methods in `PairOrder`: the headline first, then the room, then the rest; a named pair
    as named, any other the better one first."""
    comparisons = [PairedComparison.from_dict(e) for e in summary.get("paired", [])]
    if not comparisons:
        return ""
    order, labels = PairOrder.of(summary), summary_names(summary)
    oriented = [c.swapped() if order.flips(c.a, c.b, c.diff) else c for c in comparisons]
    rows = [
        order.note(labels, quote=lambda name: f"`{name}`"),
        "",
        "| pair (a vs b) | paired episodes | a only | b only | difference | p |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in sorted(oriented, key=lambda c: order.key(c.a, c.b, c.diff, c.p_value)):
        mark = "*" if c.significant else ""
        pair = f"{labels[c.a]} vs {labels[c.b]}"
        role = order.role(c.a, c.b)
        rows.append(
            f"| {f'**{pair}** ({role})' if role else pair} | {c.episodes} | {c.a_only} | {c.b_only} | "
            f"{c.diff * 100:+.1f} pts | {c.p_value:.3g}{mark} |"
        )
    return "\n".join(rows)


# --- the paired table's order: the run's main comparison first ------------------------------------------------
def headline(summary: dict[str, Any]) -> tuple[Pair, str] | None:
    """The run's main comparison and why it is the one: the best trained controller against its method's
    heuristic; else, on a decision preset, the room (`oracle-agent` against the heuristic); else RIR's best
    controller against the best other method. Hindsight controllers bound a comparison and never contend
    in one (as in the pipeline's headline). None where no such pair ran."""
    methods = summary.get("methods", {})
    contenders = sorted(
        (k for k in methods if not ((spec := controller_spec(k)) and spec.uses_hindsight)),
        key=lambda k: -methods[k].get("success_rate", 0.0),
    )
    for key in contenders:
        base = f"{key.partition('/')[0]}/{ROOM_BASE}"
        if (spec := controller_spec(key)) and spec.uses_trained_model and base in methods:
            return (key, base), "the best trained controller against the heuristic"
    if rooms := room_pairs(summary):
        return rooms[0], f"the room: what a perfect When and Where add to the {ROOM_BASE} on this agent"
    ours = [k for k in contenders if k.partition("/")[0] == RIR]
    others = [k for k in contenders if k.partition("/")[0] != RIR]
    if ours and others:
        return (ours[0], others[0]), "RIR's best controller against the best other method"
    return None


def room_pairs(summary: dict[str, Any]) -> list[Pair]:
    """`<method>/oracle-agent` against `<method>/heuristic` for each method the summary has a room for."""
    methods = dict.fromkeys(row["method"] for row in summary.get("room", []))
    return [(f"{m}/{ROOM_BOUND}", f"{m}/{ROOM_BASE}") for m in methods]


@dataclass(frozen=True)
class PairOrder:
    """How the paired table reads: the headline, then the room, then the pairs against the headline's
    second method or the main table's reference, then the rest; within each, the largest difference
    first. A pair of the first two reads as named; any other, the better method first. Shared by report.md
    and `rir view` (eval/view/page.py), which show one order."""

    named: dict[Pair, str]  # the headline and the rooms, in order, with their role
    references: frozenset[str]
    why: str  # why the headline is the one

    @classmethod
    def of(cls, summary: dict[str, Any]) -> PairOrder:
        top, rooms = headline(summary), room_pairs(summary)
        named: dict[Pair, str] = {top[0]: "headline, the room" if top[0] in rooms else "headline"} if top else {}
        for pair in rooms:
            named.setdefault(pair, "room")
        references = {top[0][1]} if top else set()
        if reference := reference_method(summary):
            references.add(reference)
        return cls(named, frozenset(references), top[1] if top else "")

    def role(self, a: str, b: str) -> str:
        """`headline`, `room` (`headline, the room` where they are one), or empty, for a pair read a vs b."""
        return self.named.get((a, b), "")

    def flips(self, a: str, b: str, diff: float) -> bool:
        """Whether a against b reads better as b against a: a named pair the other way round, or another
        pair whose first method did worse."""
        return (b, a) in self.named or ((a, b) not in self.named and diff < 0)

    def key(self, a: str, b: str, diff: float, p_value: float) -> tuple[Any, ...]:
        """The sort key of an oriented pair: its tier, then the largest difference, the smallest p."""
        named = list(self.named)
        if (a, b) in self.named:
            tier = named.index((a, b))
        else:
            tier = len(named) + (0 if {a, b} & self.references else 1)
        return (tier, -abs(diff), p_value, a, b)

    def note(self, labels: dict[str, str], quote: Callable[[str], str]) -> str:
        """The order in one sentence, each method by its label `quote`d (backticks in Markdown)."""

        def name(key: str) -> str:
            return quote(labels.get(key, key))

        named = list(self.named.items())
        parts = []
        if named and named[0][1].startswith("headline"):
            (a, b), _ = named.pop(0)
            parts.append(f"the headline, {name(a)} vs {name(b)} ({self.why})")
        parts += [f"the room, {name(a)} vs {name(b)}" for (a, b), _ in named]
        if self.references:
            parts.append(f"the pairs against {' or '.join(name(r) for r in sorted(self.references))}")
        parts.append("the rest" if parts else "every pair")
        return f"Order: {', then '.join(parts)}; the largest difference first within each."


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


def offsets_table(records: list[EpisodeRecord], labels: dict[str, str]) -> str:
    """Where each method's restores landed relative to the first injected error (methods by their labels)."""
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
            f"| {labels.get(name, name)} | {n} | {sum(v == 0 for v in values) / n:.0%} "
            f"| {sum(v < 0 for v in values) / n:.0%} | {sum(v > 0 for v in values) / n:.0%} |"
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
LEGEND_NOTE = (
    "Shortened names in the tables (a module swap is named by its modules that are not the heuristic's), in full:"
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
    lines += section("Where restores landed", OFFSETS_NOTE, offsets_table(records, summary_names(summary)))
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
