"""Summary statistics of episode records: success rate with a Wilson interval, means, and paired tests.

`summarize` produces the `summary.json` body, a contract other stages read:
`{"methods": {"<method>[/<controller>]": {"episodes", "success_rate", "mean_score", "agent_calls",
"controller_calls", "controller_seconds", "rollbacks", "recoveries", "env_steps", "wall_s", ...}}, "paired": [{"a", "b",
"episodes", "a_only", "b_only", "diff", "p_value", "significant", ...}], "config": {...}}`. `paired` holds
one exact McNemar comparison per unordered pair of method keys (see eval/paired.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from eval.paired import pairwise
from rir_runtime.trace import EpisodeRecord, RestoreEvent


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0 and n, unlike Wald)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def summarize_group(records: list[EpisodeRecord]) -> dict[str, Any]:
    n = len(records)
    wins = sum(r.success for r in records)
    low, high = wilson_interval(wins, n)
    return {
        "episodes": n,
        "success_rate": round(wins / n, 4) if n else 0.0,
        "success_ci95": [round(low, 4), round(high, 4)],
        "mean_score": _mean([float(r.score) for r in records]),
        "agent_calls": _mean([r.agent_calls for r in records]),  # the agent's own
        "controller_calls": _known_mean([r.controller_calls for r in records]),  # the controller's model calls
        "controller_seconds": _mean([r.controller_seconds for r in records]),
        "controller_tokens": _mean([r.controller_prompt_tokens + r.controller_completion_tokens for r in records]),
        "charge_controller": _accounting(records),
        "budget_agent": _mean([r.budget_agent for r in records]),  # resolved per episode (relative budgets vary)
        "rollbacks": _mean([r.rollbacks for r in records]),
        "recoveries": _mean([r.recoveries for r in records]),  # with k = 0 ones (stay and reflect)
        "env_steps": _mean([r.env_steps for r in records]),
        "wall_s": _mean([r.wall_s for r in records]),
        "parse_failures": _mean([r.parse_failures for r in records]),
    }


def _accounting(records: list[EpisodeRecord]) -> bool | None:
    """Whether B_agent paid for the controller's calls in these episodes; None when they differ."""
    charged = {r.charge_controller for r in records}
    return charged.pop() if len(charged) == 1 else None


def _known_mean(values: list[int | None]) -> float | None:
    """The mean, or None when any record predates the field (a mean over some episodes would mislead)."""
    known = [v for v in values if v is not None]
    return _mean([float(v) for v in known]) if len(known) == len(values) else None


def summarize(records: Iterable[EpisodeRecord], config: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        groups[r.method_key].append(r)
    return {
        "methods": {k: summarize_group(v) for k, v in groups.items()},
        "paired": [c.to_dict() for c in pairwise(groups)],
        "config": config,
    }


def restore_offsets(records: list[EpisodeRecord]) -> dict[str, list[int]]:
    """Restore point minus the first injected error of the abandoned branch (0 = just before it)."""
    offsets: dict[str, list[int]] = defaultdict(list)
    for r in records:
        for e in r.events:
            if isinstance(e, RestoreEvent) and e.first_error is not None:
                offsets[r.method_key].append(e.to - e.first_error)
    return dict(offsets)
