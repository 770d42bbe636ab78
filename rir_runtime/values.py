"""Hindsight values by branch re-execution: `V(C_i)`, the chance to still succeed from checkpoint i.

From a checkpoint the oracle plan (the environment's expert) is followed to the end; success
means the task can still be completed from there. Used by the oracle controller (an upper bound)
and by data_gen's hindsight labels. Where errors are irreversible, `V` can only fall along a
branch, so the latest checkpoint with maximal `V` is found by bisection in O(log n) probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rir_runtime.envs.base import Env, Snapshot
from rir_runtime.errors import RestoreError


@dataclass
class ValueProbe:
    """Estimates `V` of snapshots on an environment, counting the env steps it spends.

    The environment is returned to where it was after each probe, so the probe can run in the
    middle of an episode.
    """

    env: Env
    max_steps: int = 60
    env_steps: int = 0
    probes: int = 0

    def value(self, snapshot: Snapshot) -> float:
        here = self.env.checkpoint()
        try:
            return self._rollout(snapshot)
        finally:
            self.env.restore(here)

    def _rollout(self, snapshot: Snapshot) -> float:
        """Follow the expert from `snapshot` (the env is left wherever the rollout ends)."""
        self.probes += 1
        try:
            self.env.restore(snapshot)
        except RestoreError:
            return 0.0
        if snapshot.kind == "replay":  # a replay re-executes the prefix: count it as spent
            self.env_steps += len(snapshot.actions)
        for _ in range(self.max_steps):
            plan = self.env.expert_actions()
            if not plan:
                return 0.0
            result = self.env.step(plan[0])
            self.env_steps += 1
            if result.done:
                return 1.0 if result.won else 0.0
        return 0.0


def latest_best_linear(indices: list[int], value: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """The latest index with maximal value, probing every index (the reference scan)."""
    values = {i: value(i) for i in indices}
    best = max(values.values())
    return max(i for i in indices if values[i] == best), values


def latest_best_bisect(indices: list[int], value: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """The same answer when `value` is non-increasing along `indices` (irreversible errors):
    the last index that keeps the first index's value, in O(log n) probes."""
    values: dict[int, float] = {}

    def v(pos: int) -> float:
        i = indices[pos]
        if i not in values:
            values[i] = value(i)
        return values[i]

    target = v(0)
    lo, hi = 0, len(indices) - 1  # invariant: v(lo) == target
    if v(hi) == target:
        return indices[hi], values
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if v(mid) == target:
            lo = mid
        else:
            hi = mid
    return indices[lo], values


class Hindsight:
    """`V(C_i)` for the checkpoints of a running episode: what the oracle controller may look at.

    The loop creates one per episode and hands it to controllers that ask for hindsight
    (`uses_hindsight`) inside their `DecisionContext`; nothing else can see the future.
    """

    def __init__(self, probe: ValueProbe, snapshot: Callable[[int], Snapshot]) -> None:
        self.probe, self._snapshot = probe, snapshot

    def value(self, checkpoint: int) -> float:
        return self.probe.value(self._snapshot(checkpoint))
