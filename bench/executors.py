"""Episodes per minute on one rollout job: local 1 worker, local 2 workers, Ray 2 workers.

    python bench/executors.py                    # about a minute per executor on a 2-core machine
    python bench/executors.py --episodes 9000    # quicker

Runs `rir rollout`'s job (built-in workshop, noisy-expert policy, RIR with the heuristic controller
plus the exploratory variants, on the train split) once per executor into a fresh folder, checks
that the three episode files hold the same records (`wall_s` aside), and prints a markdown table.
Times are end to end, as a user sees them: starting worker processes or the local Ray cluster
(`ray.init`) is included. Needs the Ray extra: pip install -e ".[ray]".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from data_gen.rollout import RolloutConfig, rollout, rollout_jobs

RUNS = (("local", 1), ("local", 2), ("ray", 2))


@dataclass(frozen=True)
class Row:
    executor: str
    workers: int
    episodes: int
    seconds: float

    @property
    def per_minute(self) -> float:
        return 60 * self.episodes / self.seconds


def job(episodes: int) -> RolloutConfig:
    """The rollout job, with enough task variations for about `episodes` episodes."""
    base = RolloutConfig(env="builtin", split="train", variations="0")
    per_variation = len(rollout_jobs(base))
    return replace(base, variations=f"0-{math.ceil(episodes / per_variation) - 1}")


def digests(path: Path) -> dict[str, str]:
    """Episode id -> hash of its record without the timing field; a duplicate id fails."""
    out: dict[str, str] = {}
    with path.open() as fh:
        for line in fh:
            record = json.loads(line)
            record.pop("wall_s")
            assert record["episode_id"] not in out, f"{record['episode_id']} was written twice in {path}"
            out[record["episode_id"]] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return out


def measure(cfg: RolloutConfig, executor: str, workers: int, out: Path) -> tuple[Row, dict[str, str]]:
    start = time.perf_counter()
    records = rollout(replace(cfg, executor=executor, workers=workers, out=str(out)))
    seconds = time.perf_counter() - start
    row = Row(executor, workers, len(records), seconds)
    del records
    return row, digests(out / "episodes-0.jsonl")


def table(rows: list[Row]) -> str:
    lines = [
        "| executor | workers | episodes | seconds | episodes/min | vs local 1 worker |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = row.per_minute / rows[0].per_minute
        lines.append(
            f"| {row.executor} | {row.workers} | {row.episodes} | {row.seconds:.1f} | {row.per_minute:,.0f} | "
            f"{ratio:.2f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=60_000, help="episodes per executor (about)")
    args = parser.parse_args()
    cfg = job(args.episodes)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average before the run {load}; job: {cfg.variations}", file=sys.stderr)
    rows, seen = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for executor, workers in RUNS:
            row, records = measure(cfg, executor, workers, Path(tmp) / f"{executor}-{workers}")
            rows.append(row)
            seen.append(records)
            print(f"{executor} x{workers}: {row.per_minute:,.0f} episodes/min", file=sys.stderr)
    same = all(s == seen[0] for s in seen[1:])
    print(table(rows))
    print(f"\nrecords identical across the three runs (wall_s aside): {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
