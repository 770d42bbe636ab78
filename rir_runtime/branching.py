"""Branching an episode at a decision point: every candidate decision played out from one restored state.

A recorded decision point is a job (task, agent, seed, controller, budgets) and the index of one of its
reviews. `branch_decisions` runs the episode once up to that review, takes a checkpoint of everything
(the environment's snapshot, the branch, the memory, the budgets spent, the agent's own state), and then,
for each candidate decision, restores that state and lets the runtime play the decision out to the end
of the episode: continue, or recover (to a given checkpoint, or where the controller's Where says),
with the What, the later reviews and the agent as the episode has them. The outcomes are exact
comparisons of decisions from one state (a scripted agent is deterministic; an LLM agent ranking
greedily too), which is what online GRPO groups need (`train/common/online_rewards.py`), and what no
agent-RL framework gives: branching from a restored checkpoint rather than rerunning from the start.
Each branch reports the fingerprint of the state it started from, so a caller can check that they all
started from one state.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from rir_runtime.decisions import Review
from rir_runtime.envs.base import TaskSpec
from rir_runtime.errors import UserInputError
from rir_runtime.lockstep import run_together
from rir_runtime.loop import Episode, EpisodeRunner, Run
from rir_runtime.prompts import DecisionContext
from rir_runtime.recovery import ReviewSchedule, segments
from rir_runtime.trace import EpisodeRecord, LocateEvent, ReviewEvent


@dataclass(frozen=True)
class Forced:
    """A decision a branch makes at the fork: continue, or recover to `restore_to` (None: where the
    controller's Where says)."""

    recover: bool
    restore_to: int | None = None
    segment: tuple[int, int] | None = None  # the coarse Where given; the controller's fine Where inside it
    draw: int = 0  # the agent's noise after the fork: 0 its own future (the episode's), k > 0 a fresh draw

    @property
    def label(self) -> str:
        if not self.recover:
            return "continue"
        if self.restore_to is not None:
            return f"recover to {self.restore_to}"
        return "recover" if self.segment is None else f"recover into {list(self.segment)}"


@dataclass(frozen=True)
class Outcome:
    """What a branch's decision did, from the fork to the end of the episode."""

    decision: Forced
    success: bool
    score: float
    rollbacks: int  # after the fork, the decision's own included
    controller_calls: int  # after the fork
    env_steps: int  # after the fork
    fingerprint: str  # of the state the branch started from
    record: EpisodeRecord


class PointNotReached(UserInputError):
    """Replaying a recorded episode did not reach the review to branch from (the environment or the agent
    acts otherwise than when the episode was recorded)."""


class _AtFork(Exception):
    """Raised inside the loop at the review to branch from; carries where the loop stood."""

    def __init__(self, trigger: str, target: int | None) -> None:
        super().__init__(trigger)
        self.trigger, self.target = trigger, target


def review_count(ep: Episode) -> int:
    return sum(isinstance(e, ReviewEvent) for e in ep.events)


def fingerprint(ep: Episode) -> str:
    """The state a decision is made from: the branch (actions and replies), the memory, the budgets spent."""
    state = [
        [(s.action, s.observation, s.score) for s in ep.history],
        ep.observation,
        ep.memory.snapshot().to_json(),
        [ep.agent_calls, ep.controller_calls, ep.recoveries, ep.env_steps],
    ]
    return hashlib.sha256(json.dumps(state).encode()).hexdigest()[:16]


class BranchingRunner(EpisodeRunner):
    """An `EpisodeRunner` that stops at review `at_review` and plays each forced decision out from there."""

    at_review: int = -1
    _forced: Forced | None = None

    def branches(self, task: TaskSpec, at_review: int, decisions: Sequence[Forced]) -> list[Outcome]:
        self.at_review = at_review
        run = self._begin(task)
        try:
            self._play(run)
        except _AtFork as fork:
            return self._from_fork(run, fork, decisions)
        raise PointNotReached(f"{task.key} ended before its review {at_review}: no decision point to branch from")

    def _from_fork(self, run: Run, fork: _AtFork, decisions: Sequence[Forced]) -> list[Outcome]:
        """Every decision played out from the fork, up to `branch_width` together (`lockstep.py`): each
        branch a runner of its own, on an engine of its own restored to the fork, its agent a fork of the
        episode's (draw 0: the same agent)."""
        here, agent = self.env.checkpoint(), self.policy
        before = (run.ep.rollbacks, run.ep.controller_calls, run.ep.env_steps)
        envs = self.env.siblings(min(self.branch_width, len(decisions)))

        def play(decision: Forced, slot: int) -> Outcome:
            env = envs[slot]
            env.restore(here)
            branch = copy.copy(self)  # its own environment, agent and forced decision; the controller is shared
            branch.env, branch.policy = env, agent.fork(env, decision.draw)
            mine = branch._rebind(run.fork())
            started = fingerprint(mine.ep)
            record = branch._resume(mine, fork, decision)
            return Outcome(
                decision,
                record.success,
                record.score,
                record.rollbacks - before[0],
                (record.controller_calls or 0) - before[1],
                record.env_steps - before[2],
                started,
                record,
            )

        return run_together([partial(play, d) for d in decisions], len(envs))

    def _resume(self, run: Run, fork: _AtFork, decision: Forced) -> EpisodeRecord:
        """The fork's review with the forced decision, then the loop as it would have gone on."""
        ep, self._forced = run.ep, decision
        try:
            recovered = self._review(ep, run.schedule, fork.trigger, fork.target)
        finally:
            self._forced = None
        if not recovered and fork.trigger == "terminal":
            ep.stop_reason = ep.stop_reason or ("won" if ep.won else "failed")
            return self._record(ep, run.probe.env_steps + run.agent.env_steps, time.perf_counter() - run.start)
        if not recovered and fork.trigger == "schedule":
            self._agent_turn(ep, run.schedule)
        return self._play(run)

    def _review(self, ep: Episode, schedule: ReviewSchedule, trigger: str, target: int | None = None) -> bool:
        if self._forced is None and review_count(ep) == self.at_review:
            raise _AtFork(trigger, target)
        return super()._review(ep, schedule, trigger, target)

    def _when(self, ep: Episode, ctx: DecisionContext) -> tuple[Review, str, float | None] | None:
        if self._forced is None:
            return super()._when(ep, ctx)
        verdict = Review("recover" if self._forced.recover else "continue", f"branch: {self._forced.label}")
        return verdict, "", None

    def _where(self, ep: Episode, target: int | None) -> int | None:
        if self._forced is not None and self._forced.segment is not None:
            admissible = [i for i in ep.store.admissible() if not ep.done or i < ep.t]
            return self._localise(ep, admissible, self._forced.segment) if admissible else None
        if self._forced is None or self._forced.restore_to is None:
            return super()._where(ep, target)
        r = self._forced.restore_to  # logged as the runtime's Where logs its answer, so replays read it alike
        segs = segments(ep.history, max(ep.store.admissible(), default=r))
        ep.log(
            LocateEvent(
                ep.t, segments=segs, segment=next((k for k, (a, b) in enumerate(segs) if a <= r < b), 0), step=r
            )
        )
        return r
