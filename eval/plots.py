"""PNG plots of an evaluation, drawn headless (Agg), so they work on servers without a display."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display needed; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from eval.summary import restore_offsets, summarize_group, wilson_interval  # noqa: E402
from rir_runtime.budgets import AgentBudget  # noqa: E402
from rir_runtime.trace import EpisodeRecord  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_bar(wins: int, n: int) -> tuple[float, float]:
    """The Wilson interval as distances below and above the rate, never negative: at 0% and 100% a
    bound equals the rate up to rounding, which can fall a hair on the wrong side of it."""
    lo, hi = wilson_interval(wins, n)
    return max(0.0, wins / n - lo), max(0.0, hi - wins / n)


def plot_success(records: list[EpisodeRecord], out: Path) -> Path:
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        groups[r.method_key].append(r)
    names = sorted(groups, key=lambda k: summarize_group(groups[k])["success_rate"])
    rates, lows, highs = [], [], []
    for name in names:
        wins, n = sum(r.success for r in groups[name]), len(groups[name])
        rates.append(wins / n)
        low, high = error_bar(wins, n)
        lows.append(low)
        highs.append(high)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.5))
    ax.barh(names, rates, xerr=[lows, highs], color="#4C72B0", capsize=3)
    ax.set_xlim(0, 1)
    ax.set_xlabel("success rate (95% Wilson CI)")
    return _save(fig, out / "success_rate.png")


def plot_budget(records: list[EpisodeRecord], out: Path) -> Path:
    groups: dict[str, dict[float, list[bool]]] = defaultdict(lambda: defaultdict(list))
    relative = any(r.budget_agent_spec.endswith("x") for r in records)
    for r in records:
        groups[r.method_key][AgentBudget.parse(r.budget_agent_spec).amount].append(bool(r.success))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, by_budget in sorted(groups.items()):
        budgets = sorted(by_budget)
        ax.plot(budgets, [sum(by_budget[b]) / len(by_budget[b]) for b in budgets], marker="o", label=name)
    ax.set_xlabel("B_agent, times the expert's path length" if relative else "agent-call budget B_agent")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return _save(fig, out / "success_vs_budget.png")


def plot_rollbacks(records: list[EpisodeRecord], out: Path) -> Path:
    groups: dict[str, list[int]] = defaultdict(list)
    for r in records:
        groups[r.method_key].append(r.rollbacks)
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.5))
    ax.barh(names, [sum(v) / len(v) for v in (groups[n] for n in names)], color="#DD8452")
    ax.set_xlabel("rollbacks per episode (mean)")
    return _save(fig, out / "rollbacks.png")


def plot_restore_offsets(records: list[EpisodeRecord], out: Path) -> Path:
    offsets = restore_offsets(records)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in sorted(offsets.items()):
        lo, hi = min(values), max(values)
        ax.hist(values, bins=range(lo, hi + 2), alpha=0.5, label=name, align="left")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("restore point - first error step (0: just before the error; < 0: earlier)")
    ax.set_ylabel("restores")
    if offsets:
        ax.legend(fontsize=7)
    return _save(fig, out / "restore_offsets.png")


def write_plots(records: list[EpisodeRecord], out: Path, sweep: bool) -> list[Path]:
    """Every plot that can be drawn; one that fails is reported and skipped, never the report's end."""
    plots = [plot_success, plot_rollbacks, plot_restore_offsets] + ([plot_budget] if sweep else [])
    paths = []
    for plot in plots:
        try:
            paths.append(plot(records, out))
        except Exception as err:  # noqa: BLE001 - a plot is decoration; the summary and report must still arrive
            plt.close("all")
            print(f"warning: skipped plot {plot.__name__} ({type(err).__name__}: {err})", file=sys.stderr)
    return paths
