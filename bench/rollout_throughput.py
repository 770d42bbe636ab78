"""Rollout throughput with an LLM policy: one episode at a time vs concurrent episodes whose model
calls are batched into one generate call (a lockstep group, `rir_runtime/lockstep.py`).

    python bench/rollout_throughput.py --model smollm2-135m-instruct --episodes 8 --concurrency 8

Runs the same episodes twice in one process (sequential, then concurrent) on the built-in
workshop with `--policy llm:<model>` in `generate` mode, and prints episodes per minute, the
batch sizes the backend actually saw, and the speed-up. Model load time is excluded.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rir_runtime.llm.shared import forget_shared_backends, shared_backend
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.policy_spec import PolicySpec


def measure(cfg: SelectionConfig, concurrency: int, out: Path) -> tuple[float, list[int]]:
    forget_shared_backends()
    backend = shared_backend(PolicySpec.parse(cfg.policy).model)  # load before timing
    jobs = expand_jobs(cfg)
    start = time.perf_counter()
    run_jobs(jobs, out / f"c{concurrency}.jsonl", concurrency=concurrency, desc=f"concurrency {concurrency}")
    minutes = (time.perf_counter() - start) / 60
    return len(jobs) / minutes, list(getattr(backend, "batches", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--budget-agent", type=int, default=12, help="agent calls per episode")
    args = parser.parse_args()
    cfg = SelectionConfig(
        env="builtin",
        tasks=["workshop-3"],
        split="dev",
        variations=f"0-{args.episodes - 1}",
        policy=f"llm:{args.model}",
        policy_mode="generate",
        methods=["react"],
        budget_agent=args.budget_agent,
    )
    with tempfile.TemporaryDirectory() as tmp:
        seq, _ = measure(cfg, 1, Path(tmp))
        par, batches = measure(cfg, args.concurrency, Path(tmp))
    print(f"episodes: {args.episodes} x {args.budget_agent} agent calls, model {args.model}, generate mode")
    print(f"one at a time:           {seq:.2f} episodes/min")
    print(
        f"{args.concurrency} concurrent, batched: {par:.2f} episodes/min "
        f"(batch sizes: mean {statistics.mean(batches) if batches else 0:.1f}, max {max(batches, default=0)})"
    )
    print(f"speed-up: {par / seq:.2f}x")


if __name__ == "__main__":
    main()
