"""shopdb restore latency: `Connection.deserialize` of a native snapshot, 1,000 times (target < 1 ms).

    python bench/shopdb_restore.py
    python bench/shopdb_restore.py --task price-change --repeats 5000

Follows the expert plan half way, checkpoints, then repeats: one write (the plan's next step, so the
database really differs), a timed `restore`, and a check that the content hash is back. Prints the
median and p99 milliseconds per restore, and the snapshot's size.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rir_runtime.envs import TaskSpec
from rir_runtime.envs.shopdb import ShopDBEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="return-refund", choices=ShopDBEnv.task_names())
    parser.add_argument("--repeats", type=int, default=1000)
    args = parser.parse_args()

    env = ShopDBEnv()
    env.reset(TaskSpec("shopdb", args.task, "dev", 0))
    plan = env.expert_actions()
    for action in plan[: len(plan) // 2]:
        env.step(action)
    snap = env.checkpoint()
    before = env.db_hash()
    write = next(a for a in env.expert_actions() if not a.startswith(("send_email", "charge_card", "finish")))
    times = []
    for _ in range(args.repeats):
        env.step(write)
        start = time.perf_counter()
        env.restore(snap)
        times.append((time.perf_counter() - start) * 1000)
    assert env.db_hash() == before, "restore did not bring the database back"
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(
        f"shopdb/{args.task}: {args.repeats} restores, median {statistics.median(times):.3f} ms, "
        f"p99 {p99:.3f} ms, snapshot {len(snap.payload.db) / 1024:.0f} KiB"
    )


if __name__ == "__main__":
    main()
