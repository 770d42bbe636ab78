"""Restore latency: native snapshot vs replay, at branch depths 5, 20 and 50.

    python bench/restore.py                       # builtin, TextWorld (native and replay), ScienceWorld
    python bench/restore.py --envs builtin --repeats 20

A branch of the requested depth is built by following the expert plan and, once the plan is
exhausted or to stay alive, harmless actions (`look`, `inventory`); then the checkpoint at that
depth is restored `--repeats` times from a state a few steps further on. Prints a table of
median milliseconds per restore.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rir_runtime.envs import Env, TaskSpec, make_env

HARMLESS = ("look", "look around", "inventory")
SETUPS = {
    # label: (env name, constructor kwargs, task)
    "builtin (replay)": ("builtin", {}, TaskSpec("builtin", "workshop-4", "dev", 0)),
    "textworld (native)": ("textworld-cooking", {}, TaskSpec("textworld-cooking", "recipe4", "dev", 0)),
    "textworld (replay)": (
        "textworld-cooking",
        {"native_snapshots": False},
        TaskSpec("textworld-cooking", "recipe4", "dev", 0),
    ),
    "scienceworld (replay)": ("scienceworld", {}, TaskSpec("scienceworld", "boil", "dev", 0)),
}


def walk_to_depth(env: Env, task: TaskSpec, depth: int) -> None:
    """Take `depth` actions that keep the episode alive: expert first, then harmless padding."""
    env.reset(task)
    plan = env.expert_actions()
    plan = plan[: min(len(plan) // 2, depth)]  # the first half only: the branch must stay alive
    taken = 0
    for action in plan:
        if env.step(action).done:
            raise RuntimeError("episode ended while building the branch")
        taken += 1
    while taken < depth:
        options = env.admissible_actions()
        action = next((a for a in HARMLESS if a in options), None) or next(a for a in options if a.startswith("look"))
        env.step(action)
        taken += 1


def time_restores(env: Env, task: TaskSpec, depth: int, repeats: int) -> float:
    walk_to_depth(env, task, depth)
    snap = env.checkpoint()
    options = env.admissible_actions()
    pad = next((a for a in HARMLESS if a in options), options[0])
    times = []
    for _ in range(repeats):
        env.step(pad)
        env.step(pad)
        start = time.perf_counter()
        obs = env.restore(snap)
        times.append(time.perf_counter() - start)
        assert obs.text == snap.observation
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default=",".join(SETUPS), help="comma list of setups: " + ", ".join(SETUPS))
    parser.add_argument("--depths", default="5,20,50")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    print(f"| setup | {' | '.join(f'depth {d} (ms)' for d in depths)} |")
    print(f"| --- | {' | '.join('---:' for _ in depths)} |")
    for label in args.envs.split(","):
        name, kwargs, task = SETUPS[label]
        env = make_env(name, **kwargs)
        try:
            cells = [f"{time_restores(env, task, d, args.repeats):.1f}" for d in depths]
        finally:
            env.close()
        print(f"| {label} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
