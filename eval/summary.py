"""Summary statistics of episode records: success rate with a Wilson interval, and means.

`summarize` produces the `summary.json` body that DESIGN.md fixes as a contract:
`{"methods": {"<method>[/<controller>]": {"episodes", "success_rate", "mean_score", "agent_calls",
"rollbacks", "env_steps", "wall_s", ...}}, "config": {...}}`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0 and n, unlike Wald)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def method_key(record: dict[str, Any]) -> str:
    """`<method>` for methods without a controller (react), else `<method>/<controller>`."""
    controller = record.get("controller") or "-"
    return record["method"] if controller == "-" else f"{record['method']}/{controller}"


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def summarize_group(records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    wins = sum(bool(r["success"]) for r in records)
    low, high = wilson_interval(wins, n)
    return {
        "episodes": n,
        "success_rate": round(wins / n, 4) if n else 0.0,
        "success_ci95": [round(low, 4), round(high, 4)],
        "mean_score": _mean([float(r["score"]) for r in records]),
        "agent_calls": _mean([r["agent_calls"] for r in records]),
        "rollbacks": _mean([r["rollbacks"] for r in records]),
        "env_steps": _mean([r["env_steps"] for r in records]),
        "wall_s": _mean([r["wall_s"] for r in records]),
        "parse_failures": _mean([r.get("parse_failures", 0) for r in records]),
    }


def summarize(records: Iterable[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[method_key(r)].append(r)
    return {"methods": {k: summarize_group(v) for k, v in groups.items()}, "config": config}


def restore_offsets(records: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Restore point minus the first injected error of the abandoned branch (0 = just before it)."""
    offsets: dict[str, list[int]] = defaultdict(list)
    for r in records:
        for e in r.get("events", []):
            if e["type"] == "restore" and e.get("first_error") is not None:
                offsets[method_key(r)].append(e["to"] - e["first_error"])
    return dict(offsets)
