"""Hindsight values by branch re-execution: `V(C_i)`, the chance to still succeed from checkpoint i.

Two policies can be followed from a checkpoint. `V_expert` (`ValueProbe`) follows the environment's
expert plan to the end: whether the task can still be completed at all. `V_agent` (`AgentProbe`)
continues the agent being controlled, with the memory a decision would leave it: whether *this*
agent still succeeds, so a loop it cannot leave reads as lost. The oracle controllers use them
(upper bounds: `oracle`, `oracle-agent`) and data_gen's hindsight labels do. Where errors are
irreversible, `V_expert` can only fall along a branch, so the latest checkpoint with maximal `V` is
found by bisection in O(log n) probes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rir_runtime.agent import AgentContext, Policy
from rir_runtime.envs.base import Env, Snapshot
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import RestoreError, RIRError
from rir_runtime.guidance import Guidance
from rir_runtime.memory import ReflectionMemory


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


@dataclass(frozen=True)
class ValueTable:
    values: dict[int, float]  # every checkpoint asked for
    implied: tuple[int, ...]  # those not measured


def complete_values(measured: Mapping[int, float], checkpoints: Sequence[int]) -> ValueTable:
    """V for every checkpoint from a bisection's probes: as measured, else the value of the nearest
    measured one after it (none after: 0, the least V can be). Exact where V only falls along a branch
    and the probes are 0/1 (`V_expert` with irreversible errors); a lower bound otherwise."""
    probed = sorted(measured)
    values: dict[int, float] = {}
    implied = []
    for i in sorted(set(checkpoints) | set(measured)):
        if i in measured:
            values[i] = float(measured[i])
            continue
        later = next((j for j in probed if j > i), None)
        values[i] = float(measured[later]) if later is not None else 0.0
        implied.append(i)
    return ValueTable(values, tuple(implied))


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


def play_on(
    env: Env,
    policy: Policy,
    task: str,
    objective: str,
    memory: ReflectionMemory,
    history: tuple[Step, ...],
    observation: str,
    guidance: Guidance,
    max_calls: int,
) -> tuple[bool, int]:
    """Let the agent act from where the environment stands until the episode ends or `max_calls`
    actions are spent, without any recovery: (won, environment steps). A final response or a
    rollback call ends it unwon. `V_agent` and its labels run every continuation through this."""
    steps = 0
    for _ in range(max_calls):
        ctx = AgentContext(task, objective, memory, history, observation, env.admissible_actions, guidance)
        act = policy.act(ctx)
        if act.kind != "task":
            return False, steps
        result = env.step(act.text)
        steps += 1
        history += (Step(len(history), act.text, result.observation, result.score, result.won, result.lost),)
        observation = result.observation
        if result.done:
            return result.won, steps
    return False, steps


# (environment, continuation k) -> the agent continuation k plays; k = 0 meets the agent's own future
PolicyFork = Callable[[Env, int], Policy]


@dataclass(frozen=True)
class Start:
    """Where a continuation starts: a checkpoint, the branch up to it, and the memory the agent has there."""

    snapshot: Snapshot
    history: tuple[Step, ...]
    memory: ReflectionMemory
    observation: str = ""  # what the agent sees there
    current: bool = False  # the environment stands there now: the first continuation needs no restore


# An option of a recovery decision: None = continue the branch as it is; i = restore to checkpoint i
# keeping the lesson a recovery there would write (i = the current checkpoint: stay, with the lesson).
Option = int | None


@dataclass
class AgentProbe:
    """`V_agent`: the share of K continuations of the controlled agent that succeed from a start, each
    capped at the agent calls it has left. Cached by (branch, memory, cap): a deterministic agent (the
    scripted expert; an LLM ranking greedily) needs K = 1, and reviews of one branch share most of their
    continuations. The environment is returned to where it was once a decision's options are valued,
    so probing can run in the middle of an episode."""

    env: Env
    fork: PolicyFork
    guidance: Guidance = field(default_factory=Guidance)
    rollouts: int = 1
    first: int = 0  # continuations first .. first + rollouts - 1; 0 is the agent's own future, 1.. fresh draws
    env_steps: int = 0
    continuations: int = 0
    _cache: dict[str, float] = field(default_factory=dict)

    def values(self, task: str, objective: str, starts: dict[Option, Start], max_calls: int) -> dict[Option, float]:
        """`V_agent` of every option; the environment is restored once, after the last continuation."""
        keys = {o: json.dumps([task, [s.action for s in st.history], st.memory.snapshot().to_json(), max_calls])
                for o, st in starts.items()}  # fmt: skip
        todo = sorted((o for o in starts if keys[o] not in self._cache), key=lambda o: not starts[o].current)
        if todo:
            here, moved = self.env.checkpoint(), False
            try:
                for option in todo:
                    wins = []
                    for k in range(self.first, self.first + self.rollouts):
                        wins.append(self._continue(task, objective, starts[option], max_calls, k, moved))
                        moved = True
                    self._cache[keys[option]] = sum(wins) / len(wins)
            finally:
                if moved:
                    self.env.restore(here)
        return {o: self._cache[keys[o]] for o in starts}

    def _continue(self, task: str, objective: str, start: Start, max_calls: int, k: int, moved: bool) -> bool:
        """One continuation; `moved`: the environment has left the start since the decision began (a
        start where it still stands needs no restore, which on a replayed benchmark costs the prefix)."""
        observation = start.observation
        if moved or not start.current:
            try:
                observation = self.env.restore(start.snapshot).text
            except RestoreError:
                return False
            if start.snapshot.kind == "replay":  # a replay re-executes the prefix: count it as spent
                self.env_steps += len(start.snapshot.actions)
        self.continuations += 1
        policy = self.fork(self.env, k)
        won, steps = play_on(
            self.env, policy, task, objective, start.memory, start.history, observation, self.guidance, max_calls
        )
        self.env_steps += steps
        return won


class Hindsight:
    """What the oracle controllers may look at in a running episode: `value(i)`, `V_expert(C_i)`, and,
    where the loop can continue its agent, `agent_values(options)`, `V_agent` of continuing or of a
    recovery to checkpoint i with its lesson kept.

    The loop creates one per episode and hands it to controllers that ask for hindsight
    (`uses_hindsight`) inside their `DecisionContext`; nothing else can see the future.
    """

    def __init__(
        self,
        probe: ValueProbe,
        snapshot: Callable[[int], Snapshot],
        agent_values: Callable[[list[Option]], dict[Option, float]] | None = None,
    ) -> None:
        self.probe, self._snapshot, self._agent_values = probe, snapshot, agent_values

    def value(self, checkpoint: int) -> float:
        return self.probe.value(self._snapshot(checkpoint))

    def agent_values(self, options: list[Option]) -> dict[Option, float]:
        if self._agent_values is None:
            raise RIRError("this episode cannot continue its agent in hindsight: its loop was given no policy fork")
        return self._agent_values(options)
