"""Hindsight values relative to the agent being controlled: `V_agent(C_i)`.

`V_expert(C_i)` follows the environment's expert plan from checkpoint i. Where the expert knows only
its gold path (ScienceWorld), any harmless detour drops it to 0, so review labels come out eager:
"recover" where the agent itself would still have won. `V_agent(C_i)` instead runs K continuations
of the actual agent (its policy, with the memory it had and the memory guidance it uses) from the
checkpoint and counts how often it succeeds.

A recovery in RIR rolls the world back and keeps a reflection. With `label_value: agent-lesson` the
continuations that value a recovery start with the hindsight reflection of their restore point in
memory (as the loop would add it), while the value of continuing does not: a recovery that pays only
through what the agent learned (stay where it is, blame the move that looped) then shows in the labels.

Continuations are cached by (task, action prefix, memory, k): decision points of one episode, and the
exploratory variants that share its prefix, reuse them, and a point with fewer calls left reads its
outcome off one played under a larger cap (the agent is deterministic: `rir_runtime.values.Played`); the
cache is an append-only JSONL file, so a killed build resumes. Each continuation is capped at
`max_steps` environment steps or the calls its episode had left, and ends where the agent loops. A
point's continuations play together (`rir_runtime.values.play_together`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from data_gen.points import DecisionPoint
from rir_runtime.agent import Policy
from rir_runtime.decisions import Reflection
from rir_runtime.envs import Env, Snapshot
from rir_runtime.guidance import Guidance
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policy_spec import PolicySpec
from rir_runtime.values import AUTO_WIDTH, LOOP_REPEATS, Continuation, Played, Start, branch_width, play_together

PolicyFactory = Callable[[Env, int], Policy]  # (environment, continuation index k) -> the agent
Checkpoint = tuple[int, Snapshot, Reflection | None]  # (index on the branch, its snapshot, the reflection kept)


@dataclass
class AgentValue:
    """`V_agent` of checkpoints: the share of K continuations of the agent that succeed. A call's
    uncached continuations play together, up to `width` at a time (`rir_runtime.values.play_together`),
    and a continuation whose agent loops ends there (`loop_repeats`; 0: never)."""

    make_policy: PolicyFactory
    name: str = "agent"  # the policy's name: part of each cached continuation's key
    rollouts: int = 2
    max_steps: int = 30
    guidance: Guidance = field(default_factory=Guidance)
    lesson: bool = False  # label_value agent-lesson: a recovery's continuations keep its reflection
    remember_abandoned: bool = False  # as the loop's preset: a recovery also blames the abandoned step
    cache_file: Path | None = None
    width: int = AUTO_WIDTH  # 0: by the device (`rir_runtime.values.branch_width`)
    loop_repeats: int = LOOP_REPEATS
    env_steps: int = 0
    continuations: int = 0
    _cache: dict[str, Played] = field(default_factory=dict)
    _fh: TextIO | None = None

    def __post_init__(self) -> None:
        if self.rollouts < 1 or self.max_steps < 1:
            raise ValueError("agent values need rollouts >= 1 and max_steps >= 1")
        if self.cache_file is not None and self.cache_file.exists():
            for line in self.cache_file.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self._cache[row["key"]] = Played(bool(row["won"]), 0, int(row["calls"]), bool(row["capped"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a partial last line of a killed build, or a row of an older build: it reruns

    def value(
        self, env: Env, point: DecisionPoint, i: int, snapshot: Snapshot, kept: Reflection | None = None
    ) -> float:
        """The success rate of the agent continued from checkpoint i of the point's branch; `kept`: the
        reflection a recovery to i would add to memory (None: continue with the memory as it was). A
        continuation ends after `max_steps` actions or the calls the episode had left, whichever first."""
        return self.values(env, point, [(i, snapshot, kept)])[0]

    def values(self, env: Env, point: DecisionPoint, items: Sequence[Checkpoint]) -> list[float]:
        """`value` of each (checkpoint, its snapshot, the reflection kept), the continuations that are
        not cached yet played together."""
        calls = min(self.max_steps, point.calls_left) if point.record.budget_agent else self.max_steps
        starts = [Start(snap, point.history[:i], self._memory(point, i, kept)) for i, snap, kept in items]
        keys = [[self._key(point, start, k) for k in range(self.rollouts)] for start in starts]
        todo: dict[str, Continuation] = {}
        for start, ks in zip(starts, keys, strict=True):
            for k, key in enumerate(ks):
                if self._within(key, calls) is None and key not in todo:
                    todo[key] = Continuation(start, k, calls)
        if todo:
            runs = list(todo.values())
            played = play_together(
                env, self.make_policy, point.task.key, point.objective, runs, self.guidance,
                branch_width(self.width), self.loop_repeats,
            )  # fmt: skip
            for key, outcome in zip(todo, played, strict=True):
                self._cache[key] = outcome
                self._write(key, outcome)
                self.env_steps += outcome.steps
            self.continuations += len(runs)
        return [sum(bool(self._within(key, calls)) for key in ks) / len(ks) for ks in keys]

    def _within(self, key: str, calls: int) -> bool | None:
        """Whether the continuation wins within `calls`, from one played before under any cap that tells
        (`Played.within`: the agent is deterministic); None: it must be played."""
        played = self._cache.get(key)
        return None if played is None else played.within(calls)

    def _key(self, point: DecisionPoint, start: Start, k: int) -> str:
        """A continuation, whichever decision point asks for it: the agent, the task, the branch to the
        checkpoint, the memory there (the point's, with the lesson a recovery keeps) and the draw."""
        parts = [self.name, point.task.key, [s.action for s in start.history], start.memory.snapshot().to_json(), k]
        if self.loop_repeats:  # a continuation that ends where it loops is not one that played to its cap
            parts.append(f"loop{self.loop_repeats}")
        return json.dumps(parts)

    def _memory(self, point: DecisionPoint, i: int, kept: Reflection | None) -> ReflectionMemory:
        """The memory a continuation starts with: the point's, plus what a recovery to checkpoint i keeps."""
        memory = ReflectionMemory.from_snapshot(point.memory, point.objective)
        if kept is not None:
            memory.keep(kept, point.history, i, self.remember_abandoned)
        return memory

    def _write(self, key: str, played: Played) -> None:
        if self.cache_file is None:
            return
        if self._fh is None:
            self._fh = self.cache_file.open("a")
        row = {"key": key, "won": played.won, "calls": played.calls, "capped": played.capped}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def policy_factory(policy: str, mode: str, error_rate: float, seed: int) -> PolicyFactory:
    """The agent of a rollout, as it acted there: the error-injected expert (continuation k draws its
    errors with seed + 1000k, so k = 0 meets the very mistakes the episode did) or the LLM agent (one
    model per process, loaded here, before the first continuation)."""
    from rir_runtime.llm.shared import shared_backend
    from rir_runtime.policies import make_policy

    spec = PolicySpec.parse(policy)
    if spec.is_llm:
        shared_backend(spec.model)
    return lambda env, k: make_policy(spec, env, shared_backend, mode, error_rate, seed + 1000 * k)
