"""Hindsight labels by branch re-execution.

Every review the controller made during a rollout is a decision point: the branch at that
moment is rebuilt from the episode's trace (`rir_runtime.trace.replay`), each of its checkpoints
is restored and continued with the expert plan to estimate `V(C_i)` (TextWorld `policy_commands`,
ScienceWorld's remaining gold path while the branch still follows it, the workshop's planner), and
labels follow:

- review: `recover` when the best admissible `V(C_r)` is clearly above `V(C_t)`; where the two are
  within the margin the values say nothing, and `ties` decides (continue, or the heuristic's rule);
- restore point: the latest admissible checkpoint with maximal `V` (of those probed), and its coarse
  segment;
- reflection preference: K retries of the base policy from the restore point, once per
  candidate reflection (the controller's, the hindsight one, none); higher success is chosen.

With irreversible errors `V` only falls along a branch, so the restore point is found by
bisection (O(log n) probes); `bisect=False` scans linearly, for reference and for cost figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from data_gen.agent_values import AgentValue, Checkpoint
from data_gen.points import DecisionPoint, ended
from rir_runtime.agent import AgentContext
from rir_runtime.controllers import HeuristicController, reflection_for
from rir_runtime.decisions import Reflection, avoid_lesson
from rir_runtime.envs import Env, Snapshot, TaskSpec
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import RestoreError
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import NoisyExpertPolicy
from rir_runtime.prompts import DecisionContext
from rir_runtime.recovery import segments
from rir_runtime.values import ValueProbe, latest_best_bisect, latest_best_linear

RECOVER_MARGIN = 0.5  # "well below": V must rise by at least this much to justify a recovery
# What a label means, recorded in build.json and in the cards of adapters trained on the data;
# `rir eval-controller` refuses to score an adapter on data of another version. Bump it whenever
# labelling changes what a label means (the margin, the values compared, how ties or stays are labelled).
LABEL_VERSION = 4  # 3: an agent's continuations end with the calls its episode had left; 4: or where it loops
REVIEW_TIES = ("continue", "heuristic")  # the review label where the values cannot tell the options apart


@dataclass
class Label:
    point: DecisionPoint
    values: dict[int, float]
    v_now: float
    review: str
    restore: int | None
    segment: int | None
    segments: tuple[tuple[int, int], ...]
    env_steps: int
    probes: int
    reflections: list[tuple[Reflection, float]] = field(default_factory=list)  # (candidate, success rate)
    restore_snapshot: Snapshot | None = None  # kept so reflection retries need not re-execute the branch


def branch_snapshots(env: Env, task: TaskSpec, history: tuple[Step, ...]) -> tuple[list[Snapshot], int]:
    """Checkpoints 0..t of a recorded branch, rebuilt by re-executing it; (snapshots, env steps)."""
    env.reset(task)
    snaps = [env.checkpoint()]
    for step in history:
        result = env.step(step.action)
        if result.observation != step.observation:
            raise RestoreError(f"re-executing {task.key} diverged at step {step.index} ('{step.action}')")
        snaps.append(env.checkpoint())
    return snaps, len(history)


def review_label(point: DecisionPoint, best: float, v_now: float, ties: str = "continue") -> str:
    """`recover` when recovering's best V is clearly above continuing's, `continue` when clearly below;
    in between the values are no evidence either way and `ties` decides: `continue`, or `heuristic`, the
    rule controller's decision (truncated agent continuations score 0 both ways on most reviews, and
    "continue" there taught a specialist never to recover where the heuristic's recoveries paid)."""
    if ties not in REVIEW_TIES:
        raise ValueError(f"review ties {ties!r} is not one of {', '.join(REVIEW_TIES)}")
    if best - v_now >= RECOVER_MARGIN:
        return "recover"
    if v_now - best >= RECOVER_MARGIN or ties == "continue":
        return "continue"
    return HeuristicController().review(context_for(point)).value.decision


def label_point(
    env: Env,
    point: DecisionPoint,
    bisect: bool = True,
    max_steps: int = ValueProbe.max_steps,
    agent: AgentValue | None = None,
    ties: str = "continue",
) -> Label:
    """Values, review label, restore label and segment for one decision point. `V` is the expert's
    (`V_expert`), or, with `agent`, the controlled agent's own chance from each checkpoint (`V_agent`);
    `ties`: the review label where the values cannot tell recovering from continuing (`review_label`)."""
    snaps, spent = branch_snapshots(env, point.task, point.history)
    probe = ValueProbe(env, max_steps=max_steps)
    agent_steps = agent.env_steps if agent else 0
    h = point.history
    terminal = ended(point)
    indices = list(range(len(h))) if terminal else list(range(len(h) + 1))

    def value(i: int) -> float:
        """V of recovering to checkpoint i (with agent-lesson values, its reflection kept in memory)."""
        if agent is None:
            return probe._rollout(snaps[i])
        return agent.value(env, point, i, snaps[i], hindsight_reflection(point, i) if agent.lesson else None)

    if not indices:
        return Label(point, {}, 0.0, "continue", None, None, (), spent, 0)
    if agent is not None and not bisect:  # every checkpoint is asked for: play all their continuations together
        asked: list[Checkpoint] = [
            (i, snaps[i], hindsight_reflection(point, i) if agent.lesson else None) for i in indices
        ]
        if agent.lesson and not terminal:  # continuing keeps the memory as it was
            asked.append((len(h), snaps[len(h)], None))
        agent.values(env, point, asked)
    _, values = (latest_best_bisect if bisect else latest_best_linear)(indices, value)
    restore = max(values, key=lambda i: (values[i], i))  # = the search's answer where V never rises
    if terminal:
        v_now = 1.0 if h[-1].won else 0.0
    elif agent is not None and agent.lesson:
        v_now = agent.value(env, point, len(h), snaps[len(h)])  # continuing keeps the memory as it was
    else:
        v_now = values[len(h)] if len(h) in values else value(len(h))
    best = values[restore]
    review = review_label(point, best, v_now, ties)
    segs = segments(h, max(indices))
    segment = next(i for i, (a, b) in enumerate(segs) if a <= restore < b)
    return Label(
        point,
        values,
        v_now,
        review,
        restore if best > 0 else None,
        segment if best > 0 else None,
        segs,
        spent + probe.env_steps + (agent.env_steps - agent_steps if agent else 0),
        probe.probes,
        restore_snapshot=snaps[restore] if best > 0 else None,
    )


# --- reflection preference ----------------------------------------------------------------------------
def retry_seeds(label: Label, retries: int) -> list[int]:
    """The first retry replays the episode's own seed, so the expert meets the very mistake it made
    (it recurs unless the reflection prevents it); further retries draw fresh error points."""
    return [label.point.record.seed] + [1000 + k for k in range(1, retries)]


def retry_success(
    env: Env,
    label: Label,
    reflection: Reflection,
    retries: int,
    error_rate: float,
    max_steps: int = ValueProbe.max_steps,
) -> float:
    """Success rate of K base-policy continuations from the restore point with `reflection` in memory."""
    point, r, start = label.point, label.restore, label.restore_snapshot
    assert r is not None and start is not None
    history = point.history[:r]
    wins = 0
    for seed in retry_seeds(label, retries):
        memory = ReflectionMemory.from_snapshot(point.memory)
        memory.add(reflection)
        env.restore(start)
        policy = NoisyExpertPolicy(env, error_rate, seed=seed)
        h, obs = history, start.observation
        for _ in range(max_steps):
            act = policy.act(AgentContext(point.task.key, "", memory, h, obs, env.admissible_actions))
            if act.kind != "task":
                break
            res = env.step(act.text)
            h = h + (Step(len(h), act.text, res.observation, res.score, res.won, res.lost),)
            obs = res.observation
            if res.done:
                wins += res.won
                break
    return wins / retries


def hindsight_reflection(point: DecisionPoint, r: int) -> Reflection:
    """The reflection a recovery to checkpoint r keeps (the heuristic What's, from the branch as it stood)."""
    return reflection_for(context_for(point, restore_point=r), r)


def reflection_candidates(label: Label) -> list[Reflection]:
    """The controller's own reflection (if any), the hindsight one, the hindsight one blaming another
    action of the abandoned branch (as informative, wrong about the cause), and none (a baseline)."""
    ctx = context_for(label.point, restore_point=label.restore)
    r = label.restore or 0
    hindsight = reflection_for(ctx, r)  # = hindsight_reflection(label.point, r), on the context built above
    out = [hindsight]
    if hindsight.failure is not None:
        culprit = hindsight.failure.action
        others = [s.action for s in ctx.history[r + 1 :] + ctx.history[:r][::-1] if s.action != culprit]
        if others:
            wrong = others[0]  # the next step after the culprit, else the one before it
            out.append(replace(hindsight, failure=replace(hindsight.failure, action=wrong, lesson=avoid_lesson(wrong))))
    own = label.point.reflection
    if own is not None and own not in out:
        out.insert(0, own)
    return [*out, Reflection()]


def context_for(point: DecisionPoint, trigger: str | None = None, **extra: Any) -> DecisionContext:
    """The same `DecisionContext` the loop builds at inference, rebuilt from the trace."""
    objective = point.objective
    memory = ReflectionMemory.from_snapshot(point.memory, objective)
    h = point.history
    admissible = tuple(range(len(h) if ended(point) else len(h) + 1))
    score = h[-1].score if h else 0.0
    return DecisionContext(
        point.task.key,
        objective,
        memory.render(1200),
        h,
        point.observation,
        score,
        trigger or point.trigger,
        admissible,
        blamed_actions=tuple(f.action for f in memory.failures),
        max_score=point.max_score,
        **extra,
    )
