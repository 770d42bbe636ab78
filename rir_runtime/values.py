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
from dataclasses import dataclass, field, replace
from functools import partial

from rir_runtime.agent import AgentContext, Policy
from rir_runtime.envs.base import Env, Snapshot
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import RestoreError, RIRError
from rir_runtime.guidance import Guidance
from rir_runtime.lockstep import run_together
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


LOOP_REPEATS = 3  # a continuation whose agent repeats one step (or a pair) this often is called lost
AUTO_WIDTH = 0  # continuations played together: 8 where a GPU batches them, 1 on a CPU (bench/branch_values.py)


def branch_width(asked: int) -> int:
    """The continuations a decision plays together: as asked, or for AUTO_WIDTH 8 where a GPU is visible
    and 1 on a CPU, where a batch costs what its rows cost one by one and one branch at a time reuses its
    siblings' prompts better (7.7 s against 9.7 s a valued decision behind the shipped agent)."""
    if asked != AUTO_WIDTH:
        return asked
    from rir_runtime.llm.device import default_device

    return 8 if default_device() == "cuda" else 1


def looping(history: tuple[Step, ...], repeats: int = LOOP_REPEATS) -> bool:
    """The branch's last steps are one cycle of one or two actions, seen `repeats` times in a row with the
    same replies: the agent keeps doing what changes nothing. 0 never calls a branch looping."""
    if repeats < 2:
        return False
    for period in (1, 2):
        span = period * repeats
        if len(history) < span:
            continue
        tail = [(s.action, s.observation, s.score) for s in history[-span:]]
        if all(tail[i] == tail[i % period] for i in range(span)):
            return True
    return False


@dataclass(frozen=True)
class Played:
    """What one continuation did: whether it won, its environment steps (a replayed restore's prefix
    included), the agent calls it made, and whether the cap stopped it (not the episode, the agent or a
    loop)."""

    won: bool
    steps: int
    calls: int
    capped: bool

    def within(self, cap: int) -> bool | None:
        """Whether the same continuation wins within `cap` calls: the agent is deterministic, so a win after
        k calls wins under any cap >= k, and one that ended without a win never wins; None where this one
        was stopped by a smaller cap and so says nothing about more calls."""
        if self.won:
            return self.calls <= cap
        if self.capped and cap > self.calls:
            return None
        return False


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
    loop_repeats: int = LOOP_REPEATS,
) -> Played:
    """Let the agent act from where the environment stands until the episode ends, `max_calls` actions
    are spent or the agent loops (`looping`), without any recovery. A final response or a rollback call
    ends it unwon. `V_agent` and its labels run every continuation through this.

    A looping continuation is called lost before its calls run out: an agent that repeated a step three
    times with nothing changing goes on repeating it, and the rest of the loop is most of what valuing a
    looping agent's decision costs."""
    steps, start = 0, len(history)
    for call in range(1, max_calls + 1):
        ctx = AgentContext(task, objective, memory, history, observation, env.admissible_actions, guidance)
        act = policy.act(ctx)
        if act.kind != "task":
            return Played(False, steps, call, False)
        result = env.step(act.text)
        steps += 1
        history += (Step(len(history), act.text, result.observation, result.score, result.won, result.lost),)
        observation = result.observation
        if result.done:
            return Played(result.won, steps, call, False)
        if looping(history[start:], loop_repeats):
            return Played(False, steps, call, False)
    return Played(False, steps, max_calls, True)


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


@dataclass(frozen=True)
class Continuation:
    """One continuation to play: from `start`, draw `k` of the agent's noise, at most `max_calls` actions."""

    start: Start
    k: int
    max_calls: int


def play_together(
    env: Env,
    fork: PolicyFork,
    task: str,
    objective: str,
    runs: Sequence[Continuation],
    guidance: Guidance,
    width: int = 1,
    loop_repeats: int = LOOP_REPEATS,
) -> list[Played]:
    """What each continuation did, up to `width` played together on engines of their own
    (`Env.siblings`), their agent calls batched
    (`rir_runtime/lockstep.py`). `V_agent` of the oracle and of the labels both come through here.
    A first continuation whose start is `current` runs on `env` as it stands; the environment is left
    wherever the last continuation on it ended."""
    envs = env.siblings(min(width, len(runs)))
    unmoved = [True] + [False] * (len(envs) - 1)  # slot 0 is `env`, still where the caller left it

    def run(c: Continuation, slot: int) -> Played:
        engine, stays = envs[slot], c.start.current and unmoved[slot]
        unmoved[slot] = False
        observation, spent = c.start.observation, 0
        if not stays:
            try:
                observation = engine.restore(c.start.snapshot).text
            except RestoreError:
                return Played(False, 0, 0, False)
            if c.start.snapshot.kind == "replay":  # a replay re-executes the prefix: count it as spent
                spent = len(c.start.snapshot.actions)
        played = play_on(
            engine, fork(engine, c.k), task, objective, c.start.memory, c.start.history, observation, guidance,
            c.max_calls, loop_repeats,
        )  # fmt: skip
        return replace(played, steps=spent + played.steps)

    return run_together([partial(run, c) for c in runs], len(envs))


@dataclass
class AgentProbe:
    """`V_agent`: the share of K continuations of the controlled agent that succeed from a start, each
    capped at the agent calls it has left. A deterministic agent (the scripted expert; an LLM decoding
    greedily) needs K = 1, and reviews of one branch share most of their continuations: each is kept by
    (start, draw), and a later review with fewer calls left reads its outcome off the one played
    (`Played.within`) instead of playing it again. A decision's continuations play together, up to
    `width` at a time (`play_together`). The environment is returned to where it was once a decision's
    options are valued, so probing can run in the middle of an episode."""

    env: Env
    fork: PolicyFork
    guidance: Guidance = field(default_factory=Guidance)
    rollouts: int = 1
    first: int = 0  # continuations first .. first + rollouts - 1; 0 is the agent's own future, 1.. fresh draws
    width: int = 1  # continuations played together (1: one after another)
    loop_repeats: int = LOOP_REPEATS
    env_steps: int = 0
    continuations: int = 0
    _played: dict[tuple[str, int], Played] = field(default_factory=dict)

    def values(self, task: str, objective: str, starts: dict[Option, Start], max_calls: int) -> dict[Option, float]:
        """`V_agent` of every option; the environment is restored once, after the last continuation."""
        keys = {o: json.dumps([task, [s.action for s in st.history], st.memory.snapshot().to_json()])
                for o, st in starts.items()}  # fmt: skip
        draws = range(self.first, self.first + self.rollouts)
        todo: dict[tuple[str, int], Continuation] = {}  # the current start first: it needs no restore
        for o in sorted(starts, key=lambda o: not starts[o].current):
            for k in draws:
                if self._within((keys[o], k), max_calls) is None and (keys[o], k) not in todo:
                    todo[keys[o], k] = Continuation(starts[o], k, max_calls)
        if todo:
            here = self.env.checkpoint()
            try:
                played = play_together(
                    self.env, self.fork, task, objective, list(todo.values()), self.guidance, self.width,
                    self.loop_repeats,
                )  # fmt: skip
            finally:
                self.env.restore(here)
            for key, outcome in zip(todo, played, strict=True):
                self._played[key] = outcome
                self.env_steps += outcome.steps
            self.continuations += len(todo)
        return {o: sum(bool(self._within((keys[o], k), max_calls)) for k in draws) / self.rollouts for o in starts}

    def _within(self, key: tuple[str, int], cap: int) -> bool | None:
        played = self._played.get(key)
        return None if played is None else played.within(cap)


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
        chunk: int = 1,
    ) -> None:
        self.probe, self._snapshot, self._agent_values = probe, snapshot, agent_values
        self.chunk = max(1, chunk)  # restores valued together by `best_agent_restore`

    def value(self, checkpoint: int) -> float:
        return self.probe.value(self._snapshot(checkpoint))

    def agent_values(self, options: list[Option]) -> dict[Option, float]:
        if self._agent_values is None:
            raise RIRError("this episode cannot continue its agent in hindsight: its loop was given no policy fork")
        return self._agent_values(options)

    def best_agent_restore(self, checkpoints: list[int]) -> tuple[int, float]:
        """The latest checkpoint of highest `V_agent` (a recovery there, its lesson kept) and that value,
        valuing only what can change the answer: latest first, `chunk` restores together, stopping at a
        chunk where one always wins (no earlier checkpoint can be both better and later). The answer is
        the one every checkpoint's value gives; a looping agent's decision no longer pays for the
        continuations of every restore before the one that works."""
        best: tuple[int, float] | None = None
        ordered = sorted(checkpoints, reverse=True)
        for start in range(0, len(ordered), self.chunk):
            values = self.agent_values(list[Option](ordered[start : start + self.chunk]))
            for i in sorted(values, key=lambda i: -i if i is not None else 0):
                if i is not None and (best is None or values[i] > best[1]):
                    best = (i, values[i])
            if best is not None and best[1] >= 1.0:
                break
        if best is None:
            raise RIRError("best_agent_restore needs at least one checkpoint")
        return best
