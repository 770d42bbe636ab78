"""Summary statistics of episode records: success rate with a Wilson interval, means, and paired tests.

`summarize` produces the `summary.json` body, a contract other stages read:
`{"methods": {"<method>[/<controller>]": {"episodes", "success_rate", "mean_score", "agent_calls",
"controller_calls", "controller_seconds", "rollbacks", "recoveries", "env_steps", "wall_s", ...}}, "paired": [{"a", "b",
"episodes", "a_only", "b_only", "diff", "p_value", "significant", ...}], "config": {...}}`. `paired` holds
one exact McNemar comparison per unordered pair of method keys (see eval/paired.py).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from eval.paired import pairwise
from rir_runtime.trace import EpisodeRecord, RestoreEvent

SUMMARY = "summary.json"  # the file `rir eval` writes the summary into (`eval/report.py`)


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
    records = list(records)
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        groups[r.method_key].append(r)
    summary = {
        "methods": {k: summarize_group(v) for k, v in groups.items()},
        "paired": [c.to_dict() for c in pairwise(groups)],
        "config": config,
    }
    if rooms := room(records):
        summary["room"] = rooms
    return summary


ROOM_BOUND, ROOM_BASE = "oracle-agent", "heuristic"  # the room: what a better controller could add on this agent
# The heuristic's When with the oracle-agent's Where (as a composite controller names itself): the share of the
# room a better Where alone takes. On the decision presets it is nearly all of it.
WHERE_BOUND = "when=heuristic,where=oracle-agent,what=heuristic"
# The same with the Where valued by fresh draws of the agent's noise (`oracle-agent:<K>`, any K): the Where's
# room without the agent's luck, the bound for a Where that reads the trajectory.
FRESH_WHERE_BOUND = re.compile(r"when=heuristic,where=oracle-agent:\d+,what=heuristic")
# The whole oracle-agent valued by fresh draws (`oracle-agent:<K>`, When and Where): the room without the agent's
# luck; a reference, not a strict bound (K draws can misjudge continuing: below the fresh Where on every preset).
FRESH_BOUND = re.compile(r"oracle-agent:\d+")


def rate_matching(rates: dict[str, float], method: str, controller: re.Pattern[str]) -> float | None:
    """The rate of `method` run with a controller `controller` matches (the last by name, whatever its K);
    None where none ran."""
    keys = sorted(k for k in rates if k.startswith(f"{method}/") and controller.fullmatch(k.split("/", 1)[1]))
    return rates[keys[-1]] if keys else None


def room(records: list[EpisodeRecord]) -> list[dict[str, Any]]:
    """The room a learned controller has: `<method>/oracle-agent` minus `<method>/heuristic`, paired,
    over all episodes of the run and per task (a grid cell), for every method that ran both; with
    react, `<method>/oracle` (valued by the expert) and the oracle-agent's Where behind the heuristic's
    When beside it, and both valued by fresh draws of the agent's noise, where they ran. Empty when no
    method ran both."""
    methods = sorted({r.method for r in records if r.controller == ROOM_BOUND})
    rows = []
    for method in methods:
        bound, base = f"{method}/{ROOM_BOUND}", f"{method}/{ROOM_BASE}"
        scopes = [("all", records)] + [
            (t, [r for r in records if r.task == t]) for t in sorted({r.task for r in records})
        ]
        for scope, chosen in scopes:
            by_key: dict[str, list[EpisodeRecord]] = defaultdict(list)
            for r in chosen:
                by_key[r.method_key].append(r)
            if not by_key.get(bound) or not by_key.get(base):
                continue
            rates = {k: round(sum(r.success for r in v) / len(v), 4) for k, v in by_key.items()}
            (test,) = pairwise({bound: by_key[bound], base: by_key[base]})
            test = test if test.a == bound else test.swapped()
            rows.append(
                {
                    "method": method,
                    "scope": scope,
                    "react": rates.get("react"),
                    "heuristic": rates[base],
                    "oracle_expert": rates.get(f"{method}/oracle"),
                    "oracle_agent": rates[bound],
                    "oracle_agent_where": rates.get(f"{method}/{WHERE_BOUND}"),
                    "oracle_agent_where_fresh": rate_matching(rates, method, FRESH_WHERE_BOUND),
                    "oracle_agent_fresh": rate_matching(rates, method, FRESH_BOUND),
                    **{k: v for k, v in test.to_dict().items() if k not in ("a", "b")},
                }
            )
    return rows


def restore_offsets(records: list[EpisodeRecord]) -> dict[str, list[int]]:
    """Restore point minus the first injected error of the abandoned branch (0 = just before it)."""
    offsets: dict[str, list[int]] = defaultdict(list)
    for r in records:
        for e in r.events:
            if isinstance(e, RestoreEvent) and e.first_error is not None:
                offsets[r.method_key].append(e.to - e.first_error)
    return dict(offsets)
