"""Hindsight label quality against the known error points of the error-injected expert, and the
labelling cost with and without bisection.

    python bench/label_quality.py --rollouts runs/rollout/builtin,runs/rollout/textworld

For every labelled review of every episode (RIR runs and exploratory variants alike):
- restore label vs the step just before the first *fatal* injected error of the branch. On the
  built-in workshop "fatal" is ground truth from the engine (the workshop is ruined, silently or
  not, or lost); on TextWorld and ScienceWorld it is an injected error that loses the episode at
  once (burning or wrongly cutting an ingredient, focusing on the wrong object): the engines do
  not expose silent ruin, so branches whose injected errors are all detours count as error-free;
- review label (`recover`) vs "the branch holds a fatal injected error" (precision and recall);
- env steps per label, bisection vs the linear scan.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from data_gen.build import load_runs
from data_gen.hindsight import label_point
from data_gen.points import decision_points
from rir_runtime.envs import make_env


def fatal_step(env, point) -> int | None:
    history = point.history
    if point.task.env == "builtin":
        env.reset(point.task)
        for step in history:
            result = env.step(step.action)
            if env.ruined_ingredients() or result.lost:
                return step.index
        return None
    return next((s.index for s in history if s.injected_error and s.lost), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", required=True)
    parser.add_argument("--max-points", type=int, default=400, help="labelled reviews per benchmark at most")
    args = parser.parse_args()
    episodes = load_runs(args.rollouts.split(","))
    by_env = defaultdict(list)
    for record, source in episodes:
        by_env[record.env].append((record, source))
    print(
        "| benchmark | labels | restore = step before first fatal error | review precision | review recall "
        "| env steps/label, bisection | env steps/label, linear |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for env_name, eps in by_env.items():
        env = make_env(env_name)
        restore_hits = restore_n = tp = fp = fn = 0
        cost_bisect, cost_linear = [], []
        points = [p for record, source in eps for p in decision_points(record, source)][: args.max_points]
        for point in points:
            fast, slow = label_point(env, point, bisect=True), label_point(env, point, bisect=False)
            cost_bisect.append(fast.env_steps)
            cost_linear.append(slow.env_steps)
            fatal = fatal_step(env, point)
            truth, said = fatal is not None, fast.review == "recover"
            tp, fp, fn = tp + (truth and said), fp + (said and not truth), fn + (truth and not said)
            if said and fatal is not None:
                restore_n += 1
                restore_hits += fast.restore == fatal
        env.close()
        precision = tp / (tp + fp) if tp + fp else float("nan")
        recall = tp / (tp + fn) if tp + fn else float("nan")
        restore = restore_hits / restore_n if restore_n else float("nan")
        print(
            f"| {env_name} | {len(points)} | {restore:.1%} ({restore_hits}/{restore_n}) | {precision:.1%} | "
            f"{recall:.1%} | {statistics.mean(cost_bisect):.1f} | {statistics.mean(cost_linear):.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
