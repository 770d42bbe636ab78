"""The episode loop: one loop for every method, parameterised by a `RecoveryPreset`.

Before every executable action the loop stores `C_i = (s_i, h_i)`. The agent may act, call the
`rollback` tool, or give a final response. Reviews (When) start on the agent's call, on the
adaptive schedule, and when the episode ends in failure. A recovery picks a restore point (Where:
coarse segment, then step; or the preset's fixed depth), distils a reflection from the abandoned
suffix (What), restores the environment and the branch history, and keeps the memory.

Budgets: `agent` (B_agent) counts the agent's model calls, `controller` (B_ctrl, optional) the
controller's, `rollback` (B_rb) the recoveries; with `charge_controller` the controller's calls count
against B_agent too. None is ever exceeded: each is checked before the call it would pay for.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from rir_runtime.agent import AgentContext, Policy
from rir_runtime.budgets import Budgets
from rir_runtime.controllers import Controller, failure_signal, latest_admissible_in, reflection_for
from rir_runtime.decisions import Decision, Reflection, Review, dump
from rir_runtime.envs.base import Env, TaskSpec
from rir_runtime.envs.checkpoints import CheckpointStore, Step
from rir_runtime.errors import RestoreError
from rir_runtime.guidance import EXCLUDED
from rir_runtime.memory import ReflectionMemory
from rir_runtime.prompts import DecisionContext
from rir_runtime.recovery import RecoveryPreset, ReviewSchedule, segments
from rir_runtime.trace import (
    EpisodeRecord,
    Event,
    GuidanceEvent,
    LocateEvent,
    LocateFailedEvent,
    LocateFallbackEvent,
    ReflectEvent,
    ResetEvent,
    RespondEvent,
    RestoreEvent,
    RestoreFailedEvent,
    ReviewEvent,
    RollbackCallEvent,
    StepEvent,
    ToolErrorEvent,
)
from rir_runtime.values import AUTO_WIDTH, LOOP_REPEATS, AgentProbe, Hindsight, Option, Start, ValueProbe
from rir_runtime.values import branch_width as resolve_width

ENDED_WITHOUT_WIN = "the episode ended without a win: there is nothing to continue"

DEFAULT_BUDGETS = Budgets()


@dataclass
class Episode:
    """Mutable state of one running episode (the branch lives in `history` and `store`)."""

    task: TaskSpec
    objective: str
    memory: ReflectionMemory
    store: CheckpointStore = field(default_factory=CheckpointStore)
    history: tuple[Step, ...] = ()
    observation: str = ""
    score: float = 0.0
    done: bool = False
    won: bool = False
    lost: bool = False
    agent_calls: int = 0  # the agent's own model calls
    controller_calls: int = 0  # the controller's model calls (rule decisions are free)
    controller_decisions: int = 0  # every When, Where and What the controller answered
    controller_seconds: float = 0.0
    controller_prompt_tokens: int = 0
    controller_completion_tokens: int = 0
    recoveries: int = 0
    rollbacks: int = 0
    env_steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failures: int = 0
    stop_reason: str = ""
    events: list[Event] = field(default_factory=list)
    hindsight: Hindsight | None = None  # only for controllers that read the future (the oracle)
    max_score: float | None = None
    agent_budget: int = 0  # B_agent of this episode (a relative budget resolved at reset)
    expert_steps: int | None = None  # the expert's path length at reset, where it has one

    @property
    def t(self) -> int:
        return len(self.history)

    def log(self, event: Event) -> None:
        self.events.append(event)

    def fork(self) -> Episode:
        """A copy a branch can change without touching this one (snapshots are shared: restoring one
        does not change it)."""
        return replace(self, memory=copy.deepcopy(self.memory), store=self.store.fork(), events=list(self.events))


@dataclass
class Run:
    """One running episode with its schedule and hindsight probes: what the loop carries from step to step."""

    ep: Episode
    schedule: ReviewSchedule
    probe: ValueProbe
    agent: AgentProbe
    start: float

    def fork(self) -> Run:
        return replace(self, ep=self.ep.fork(), schedule=replace(self.schedule))


class EpisodeRunner:
    """Runs episodes of one method (preset) with one policy and controller on one environment."""

    def __init__(
        self,
        env: Env,
        policy: Policy,
        controller: Controller,
        preset: RecoveryPreset,
        budgets: Budgets = DEFAULT_BUDGETS,
        review_interval: int = 4,
        memory_chars: int = 1200,
        branch_width: int = AUTO_WIDTH,
        loop_repeats: int = LOOP_REPEATS,
    ) -> None:
        self.env, self.policy, self.controller, self.preset = env, policy, controller, preset
        self.budgets, self.review_interval, self.memory_chars = budgets, review_interval, memory_chars
        # hindsight by the agent (oracle-agent): continuations played together, and where a loop ends one
        self.branch_width, self.loop_repeats = resolve_width(branch_width), loop_repeats

    # --- the loop -------------------------------------------------------------------------------
    def run(self, task: TaskSpec) -> EpisodeRecord:
        return self._play(self._begin(task))

    def _begin(self, task: TaskSpec) -> Run:
        """Reset the environment and set up the episode: memory, the first checkpoint, budgets, probes."""
        start = time.perf_counter()
        obs = self.env.reset(task)
        memory = ReflectionMemory(
            objective=obs.objective,
            mode=self.preset.memory,
            keep_state_claims=self.preset.keep_state_claims,
            keep_failures=self.preset.keep_failures,
        )
        ep = Episode(task, obs.objective, memory, observation=obs.text, score=obs.score)
        ep.store.save(self.env, ())
        probe, agent = self._probes(ep)
        schedule = ReviewSchedule(base=max(1, self.review_interval), maximum=max(16, self.review_interval))
        ep.max_score = self.env.max_score()
        if self.budgets.relative_agent:  # the expert's path can cost seconds to plan: only when asked
            ep.expert_steps = len(self.env.expert_actions()) if self.env.has_expert else None
        ep.agent_budget = self.budgets.agent_calls(ep.expert_steps)
        ep.log(ResetEvent(ep.t, observation=obs.text, objective=obs.objective, max_score=ep.max_score))
        return Run(ep, schedule, probe, agent, start)

    def _probes(self, ep: Episode) -> tuple[ValueProbe, AgentProbe]:
        """An episode's hindsight probes on this runner's environment and agent; a controller that reads
        the future (the oracles) sees them through `ep.hindsight`."""
        probe = ValueProbe(self.env)
        draws = getattr(self.controller, "hindsight_draws", 0)  # oracle-agent:<K>: K fresh draws, not its own future
        agent = AgentProbe(
            self.env,
            lambda env, k: self.policy.fork(env, k),
            self.preset.guidance,
            draws or 1,
            first=1 if draws else 0,
            width=self.branch_width,
            loop_repeats=self.loop_repeats,
        )
        if self.controller.uses_hindsight:
            values = partial(self._option_values, ep, agent)
            ep.hindsight = Hindsight(probe, lambda i: ep.store[i].snapshot, values, chunk=self.branch_width)
        return probe, agent

    def _rebind(self, run: Run) -> Run:
        """`run` (a fork of another runner's) with its probes on this runner's environment and agent."""
        probe, agent = self._probes(run.ep)
        probe.env_steps, agent.env_steps = run.probe.env_steps, run.agent.env_steps
        return replace(run, probe=probe, agent=agent)

    def _play(self, run: Run) -> EpisodeRecord:
        """The loop, from wherever the episode stands to its end; then its record."""
        ep, schedule = run.ep, run.schedule
        while True:
            if ep.done:
                if ep.won or not self._recover_allowed(ep) or not self._review(ep, schedule, "terminal"):
                    ep.stop_reason = ep.stop_reason or ("won" if ep.won else "failed")
                    break
                continue
            if not self._agent_may_call(ep):
                ep.stop_reason = "agent budget spent"
                break
            if ep.env_steps >= self.budgets.max_steps:
                ep.stop_reason = "step cap reached"
                break
            if self.preset.scheduled_review and ep.t and schedule.due(ep.t) and self._recover_allowed(ep):
                if self._review(ep, schedule, "schedule"):
                    continue
            self._agent_turn(ep, schedule)
        return self._record(ep, run.probe.env_steps + run.agent.env_steps, time.perf_counter() - run.start)

    def _agent_turn(self, ep: Episode, schedule: ReviewSchedule) -> None:
        ctx = AgentContext(
            ep.task.key,
            ep.objective,
            ep.memory,
            ep.history,
            ep.observation,
            self.env.admissible_actions,
            self.preset.guidance,
        )
        act = self.policy.act(ctx)
        if act.guided is not None:
            g = act.guided
            penalty = None if g.penalty == EXCLUDED else g.penalty
            ep.log(GuidanceEvent(ep.t, g.mode, g.warned, g.reasons, penalty, g.unguided, g.chosen, g.scores))
        ep.agent_calls += 1
        ep.prompt_tokens += act.prompt_tokens
        ep.completion_tokens += act.completion_tokens
        ep.parse_failures += int(act.parse_failure)
        if act.kind == "respond":
            ep.log(RespondEvent(ep.t, text=act.text))
            ep.done, ep.stop_reason = True, "final response"
            return
        if act.kind == "rollback":
            ep.log(RollbackCallEvent(ep.t, reason=act.reason, target=act.target))
            error = self._rollback_tool_error(ep, act.target)
            if error:
                ep.observation = f"[rollback tool] {error}"
                ep.log(ToolErrorEvent(ep.t, message=error))
                return
            self._review(ep, schedule, "agent", target=act.target)
            return
        result = self.env.step(act.text)
        step = Step(ep.t, act.text, result.observation, result.score, result.won, result.lost, act.injected_error)
        ep.store.record_step(step, result)
        ep.history = ep.history + (step,)
        ep.env_steps += 1
        ep.observation, ep.score = result.observation, result.score
        ep.log(
            StepEvent(
                ep.t,
                action=act.text,
                observation=result.observation,
                score=result.score,
                won=result.won,
                lost=result.lost,
                injected_error=act.injected_error,
                changes=tuple(result.info.get("changes", ())),
            )
        )
        if result.done:
            ep.done, ep.won, ep.lost = True, result.won, result.lost or not result.won
            return
        ep.store.save(self.env, ep.history)
        if failure_signal(self._context(ep, "signal")):
            schedule.on_signal(ep.t)

    def _rollback_tool_error(self, ep: Episode, target: int | None) -> str | None:
        if not self.preset.recovers:
            return "rollback is not available in this run; continue with a task action"
        if ep.recoveries >= self.budgets.rollback:
            return f"the rollback budget ({self.budgets.rollback}) is spent"
        if target is not None:
            reason = ep.store.reason_not_admissible(target)
            if reason:
                return f"{reason}; admissible checkpoints: {ep.store.admissible()}"
        return None

    # --- budgets ------------------------------------------------------------------------------------
    def _charged(self, ep: Episode) -> int:
        """The calls B_agent has paid for: the agent's, and the controller's when they are charged to it."""
        return ep.agent_calls + (ep.controller_calls if self.budgets.charge_controller else 0)

    def _agent_may_call(self, ep: Episode) -> bool:
        return self._charged(ep) < ep.agent_budget

    def _controller_calls_left(self, ep: Episode) -> int | None:
        """The model calls the controller may still spend; None: unbounded."""
        if self.budgets.charge_controller:
            return ep.agent_budget - self._charged(ep)
        return None if self.budgets.controller is None else self.budgets.controller - ep.controller_calls

    # --- hindsight for oracle-agent --------------------------------------------------------------------
    def _option_values(self, ep: Episode, agent: AgentProbe, options: list[Option]) -> dict[Option, float]:
        """`V_agent` of each option, as this episode would play it: continue the branch (None), or recover
        to checkpoint i keeping the reflection the rule writes there (the record `oracle-agent` then
        writes), under this preset's memory; in each, the agent plays on with the calls it has left."""
        calls = min(ep.agent_budget - self._charged(ep), self.budgets.max_steps - ep.env_steps)
        return agent.values(ep.task.key, ep.objective, {o: self._start(ep, o) for o in options}, calls)

    def _start(self, ep: Episode, option: Option) -> Start:
        memory = copy.deepcopy(ep.memory)
        checkpoint = ep.store[ep.t if option is None else option]
        if option is not None and self.preset.memory != "none":
            lesson = reflection_for(self._context(ep, "reflect", restore_point=option), option)
            memory.keep(lesson, ep.history, option, self.preset.remember_abandoned)
        return Start(checkpoint.snapshot, checkpoint.history, memory, ep.observation, option is None and not ep.done)

    # --- recovery: When, Where, What ---------------------------------------------------------------
    def _recover_allowed(self, ep: Episode) -> bool:
        """A recovery needs a rollback left and an agent call left to act on it."""
        return self.preset.recovers and ep.recoveries < self.budgets.rollback and self._agent_may_call(ep)

    def _context(
        self,
        ep: Episode,
        trigger: str,
        segments: tuple[tuple[int, int], ...] = (),
        restore_point: int | None = None,
    ) -> DecisionContext:
        blamed = tuple(f.action for f in ep.memory.failures)
        return DecisionContext(
            ep.task.key,
            ep.objective,
            ep.memory.render(self.memory_chars),
            ep.history,
            ep.observation,
            ep.score,
            trigger,
            tuple(ep.store.admissible()),
            blamed_actions=blamed,
            segments=segments,
            restore_point=restore_point,
            max_score=ep.max_score,
            hindsight=ep.hindsight,
        )

    def _decide(
        self, ep: Episode, decide: Callable[[DecisionContext], Decision], ctx: DecisionContext
    ) -> Decision | None:
        """One controller decision, counted apart from the agent's calls; None when a model-backed
        decision would exceed its budget (B_ctrl, or B_agent when the controller is charged to it)."""
        left = self._controller_calls_left(ep) if self.controller.uses_model else None
        if left is not None and left <= 0:
            return None
        start = time.perf_counter()
        decision = decide(replace(ctx, calls_left=left))
        ep.controller_seconds += time.perf_counter() - start
        ep.controller_decisions += 1
        ep.controller_calls += decision.model_calls
        ep.controller_prompt_tokens += decision.prompt_tokens
        ep.controller_completion_tokens += decision.completion_tokens
        ep.prompt_tokens += decision.prompt_tokens
        ep.completion_tokens += decision.completion_tokens
        ep.parse_failures += decision.parse_failures
        return decision

    def _review(self, ep: Episode, schedule: ReviewSchedule, trigger: str, target: int | None = None) -> bool:
        """Ask When; on "recover", run Where and What and restore. True when a recovery happened.
        The schedule counts from the step the episode goes on from: after a restore, the restore point.

        A terminal review does not ask: a branch that ended without a win has nothing left to
        continue, so "continue" there only gives up while budget remains. The runtime recovers and
        asks Where and What alone, for every controller, and spends no model call on the When."""
        ctx = self._context(ep, trigger)
        when = self._when(ep, ctx)
        if when is None:
            return False
        verdict, raw, margin = when
        ep.log(
            ReviewEvent(
                ep.t,
                trigger=trigger,
                decision=verdict.decision,
                reason=verdict.reason,
                raw=raw or dump("review", verdict),
                margin=margin,
            )
        )
        recovered = False
        if verdict.recover:
            restore_to = self._where(ep, target)
            recovered = restore_to is not None and self._recover(ep, restore_to)
        schedule.on_verdict(ep.t, verdict.recover)
        return recovered

    def _when(self, ep: Episode, ctx: DecisionContext) -> tuple[Review, str, float | None] | None:
        """(the verdict, the raw reply, a ranked review's margin), or None when no call was left for it."""
        if ctx.trigger == "terminal":
            signal = failure_signal(ctx)
            return Review("recover", signal.text if signal else ENDED_WITHOUT_WIN), "", None
        decision = self._decide(ep, self.controller.review, ctx)
        if decision is None:
            return None
        return decision.value, decision.raw, decision.meta.get("margin")

    def _where(self, ep: Episode, target: int | None) -> int | None:
        admissible = ep.store.admissible()
        if ep.done:  # a finished state (final response) is no place to resume from
            admissible = [i for i in admissible if i < ep.t]
        if not admissible:
            ep.log(LocateFailedEvent(ep.t, error="no admissible checkpoint"))
            return None
        depth = self.preset.depth
        if depth == "stay":
            return ep.t if not ep.done else None  # information-level only: nothing to stay in after the end
        if depth == "restart":
            return admissible[0]
        if target is not None:
            return target
        return self._localise(ep, admissible)

    def _localise(self, ep: Episode, admissible: list[int], segment: tuple[int, int] | None = None) -> int | None:
        """Coarse then fine (the preset may skip one); `segment`: the coarse answer, already given."""
        segs = segments(ep.history, max(admissible))
        mode = self.preset.localisation
        if mode == "fine":
            segs = ((0, max(admissible) + 1),)
        ctx = replace(self._context(ep, "locate", segments=segs), admissible=tuple(admissible))
        seg_index = segs.index(segment) if segment in segs else 0
        if len(segs) > 1 and segment not in segs:
            coarse = self._decide(ep, self.controller.locate_coarse, ctx)
            if coarse is None:
                return None
            seg_index = min(max(int(coarse.value), 0), len(segs) - 1)
        segment = segs[seg_index]
        ctx = replace(ctx, segment=segment)
        if mode == "coarse":
            inside = [i for i in admissible if segment[0] <= i < segment[1]]
            step = inside[0] if inside else latest_admissible_in(ctx)
        else:
            fine = self._decide(ep, self.controller.locate_fine, ctx)
            if fine is None:
                return None
            step = int(fine.value)
            if step not in admissible:  # a model may name a checkpoint it may not use
                ep.log(LocateFallbackEvent(ep.t, asked=step))
                step = latest_admissible_in(ctx)
        ep.log(LocateEvent(ep.t, segments=segs, segment=seg_index, step=step))
        return step

    def _recover(self, ep: Episode, r: int) -> bool:
        if self.preset.memory != "none":
            decision = self._decide(ep, self.controller.reflect, self._context(ep, "reflect", restore_point=r))
            reflection = decision.value if decision else Reflection()
            ep.memory.keep(reflection, ep.history, r, self.preset.remember_abandoned)
            ep.log(
                ReflectEvent(
                    ep.t,
                    restore_point=r,
                    reflection=reflection,
                    memory=ep.memory.snapshot(),
                    fallback=bool(decision and decision.meta.get("fallback")),  # the reply did not parse
                    budget_spent=decision is None,  # no model call was left for the What
                )
            )
        if r == ep.t and not ep.done:  # k = 0: stay, keep the reflection
            ep.recoveries += 1
            ep.log(RestoreEvent(ep.t, to=r, k=0))
            return True
        try:
            checkpoint, obs = ep.store.restore(self.env, r)
        except RestoreError as err:
            ep.log(RestoreFailedEvent(ep.t, to=r, error=str(err)))
            return False
        ep.log(RestoreEvent(ep.t, to=r, k=ep.t - r, first_error=_first_injected(ep.history)))
        ep.history, ep.observation, ep.score = checkpoint.history, obs.text, checkpoint.score
        ep.done = ep.won = ep.lost = False
        ep.stop_reason = ""
        ep.recoveries += 1
        ep.rollbacks += 1
        return True

    # --- the record ---------------------------------------------------------------------------------
    def _record(self, ep: Episode, oracle_env_steps: int, wall_s: float) -> EpisodeRecord:
        task = ep.task
        first_errors = [e.t - 1 for e in ep.events if isinstance(e, StepEvent) and e.injected_error]
        return EpisodeRecord(
            env=task.env,
            task=task.task,
            split=task.split,
            variation=task.variation,
            method=self.preset.name,
            controller=self.controller.name if self.preset.recovers else "-",
            policy=self.policy.name,
            success=bool(ep.won),
            score=ep.score,
            agent_calls=ep.agent_calls,
            controller_calls=ep.controller_calls,
            controller_decisions=ep.controller_decisions,
            controller_seconds=round(ep.controller_seconds, 4),
            controller_prompt_tokens=ep.controller_prompt_tokens,
            controller_completion_tokens=ep.controller_completion_tokens,
            charge_controller=self.budgets.charge_controller,
            budget_controller=self.budgets.controller,
            rollbacks=ep.rollbacks,
            recoveries=ep.recoveries,
            env_steps=ep.env_steps,
            prompt_tokens=ep.prompt_tokens,
            completion_tokens=ep.completion_tokens,
            wall_s=round(wall_s, 4),
            parse_failures=ep.parse_failures,
            restore_divergences=ep.store.divergences,
            oracle_env_steps=oracle_env_steps,
            first_error_step=first_errors[0] if first_errors else None,
            stop_reason=ep.stop_reason,
            memory=ep.memory.snapshot(),
            events=tuple(ep.events),
            budget_agent=ep.agent_budget,
            budget_rollback=self.budgets.rollback,
            budget_agent_spec=str(self.budgets.agent),
            expert_steps=ep.expert_steps,
        )


def _first_injected(history: tuple[Step, ...]) -> int | None:
    return next((s.index for s in history if s.injected_error), None)
