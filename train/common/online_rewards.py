"""GRPO rewards from what a decision actually did: each sampled decision played out from its decision
point's restored state (`rir train grpo --reward online`).

Every GRPO prompt is a recorded decision point (its row's `meta.job` and `meta.review_index`: the
episode's job and which of its reviews). TRL samples `num_generations` decisions per prompt; this
reward function parses each (continue or recover; a restore point; a segment), groups the samples of
one point, and hands each group to `rir_runtime.branching` through the orchestration's executor
(local processes or Ray actors, so a GPU trainer does not wait on CPU environments): the episode runs
once to the decision, its whole state is checkpointed, and each decision is played out from that one
restored state by the runtime, the agent playing on to the end (a scripted agent exactly; an LLM
agent ranking greedily). The reward is the outcome less stated costs:

    reward = success - rollback_cost x rollbacks after the decision - call_cost x controller model calls after it

so a group's advantages are exact comparisons of decisions from one state. Played once, a decision
meets the agent's own future, the mistakes it would make after it; that is luck as much as the
decision (a scripted agent's injected errors are drawn per state), so with `draws` K each decision is
played K times with the agent's noise drawn afresh and the reward is their mean. An unparseable sample
earns 0 and is not played; so do all samples of a point whose replay no longer reaches its review (the
environment or agent acting otherwise than when the episode was recorded), counted, not fatal.
Counters for the trainer's logs (`OnlineRewardLog`): restores, reward evaluations, the seconds they took
and the points not reached, per logging step.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import TrainerCallback

from data_gen.scoring.rewards import answers, replies, review_verdict
from rir_runtime.branching import Forced, Outcome, PointNotReached
from rir_runtime.decisions import parse
from rir_runtime.errors import ParseError, UserInputError
from rir_runtime.orchestration.executors import Session, make_executor
from train.common.step_phases import add_to_log

logger = logging.getLogger(__name__)

ONLINE_KINDS = ("review", "locate_coarse", "locate_fine")


def forced_decision(kind: str, text: str, choices: dict[int, list[int]], segments: list[list[int]]) -> Forced | None:
    """The decision a sampled reply makes, as a branch forces it; None for a reply that states none the
    prompt offers. A review's recovery restores where the episode's own controller's Where says."""
    if kind == "review":
        verdict = review_verdict(text)
        return None if verdict is None else Forced(verdict == "recover")
    try:
        answer = int(parse(kind, text))  # type: ignore[arg-type]
    except (ParseError, TypeError, ValueError):
        return None
    if answer not in choices:
        return None
    if kind == "locate_coarse":
        a, b = segments[answer]
        return Forced(True, segment=(int(a), int(b)))
    return Forced(True, restore_to=answer)


@dataclass(frozen=True)
class Group:
    """The decisions sampled at one decision point, to play out from one restored state."""

    job: str  # EpisodeJob JSON
    review_index: int
    decisions: tuple[Forced, ...]


Played = tuple[bool, float, int, int, int, str]  # success, score, rollbacks, controller calls, env steps, fingerprint


def play_group(group: Group) -> tuple[Group, list[Played]]:
    """Each of the group's decisions played out from its point's one restored state; runs in an
    executor's worker. Environments are cached per worker process for the whole run: the reward keeps
    one executor session open across its calls. A point the replay no longer reaches plays nothing."""
    from rir_runtime.orchestration.jobs import EpisodeJob, branch_job

    try:
        outcomes: list[Outcome] = branch_job(EpisodeJob.from_json(group.job), group.review_index, group.decisions)
    except PointNotReached as missed:
        logger.warning("%s: its samples earn no reward", missed)
        return group, []
    return group, [(o.success, o.score, o.rollbacks, o.controller_calls, o.env_steps, o.fingerprint) for o in outcomes]


def group_player() -> Callable[[Group], tuple[Group, list[Played]]]:
    """The executor's worker factory (picklable: a module-level function)."""
    return play_group


@dataclass
class OnlineReward:
    """TRL reward function: plays every sampled decision out (see the module docstring)."""

    rollback_cost: float = 0.05
    call_cost: float = 0.0
    workers: int = 1
    executor: str = "local"
    draws: int = 0  # 0: each decision played once, as the agent's own future; K: the mean of K fresh draws
    stats: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    fingerprints: dict[Group, set[str]] = field(default_factory=dict)  # the last call's: one state per group
    session: Session[Group, tuple[Group, list[Played]]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.__name__ = "online_reward"  # TRL logs a reward function under its name

    def __call__(
        self,
        completions: list[Any],
        decision: list[str],
        choices: list[str],
        segments: list[str],
        job: list[str],
        review_index: list[int],
        opening: list[str] | None = None,
        **_: Any,
    ) -> list[float | None]:
        forced = [
            forced_decision(kind, text, answers(ch), json.loads(segs or "[]")) if kind in ONLINE_KINDS else None
            for text, kind, ch, segs in zip(replies(completions, opening), decision, choices, segments, strict=True)
        ]
        groups = self._groups(forced, job, review_index)
        rewards: list[float | None] = [0.0] * len(forced)  # a sample that states no decision earns nothing
        for group, group_rewards in self.play(list(groups)).items():
            for i, reward in zip(groups[group], group_rewards, strict=True):
                rewards[i] = reward
        return rewards

    def play(self, groups: list[Group]) -> dict[Group, list[float]]:
        """Each group's decisions played out from its point's restored state: their rewards, in order
        (the generative policy's parsed samples, or the value controller's sampled options)."""
        start = time.perf_counter()
        if self.session is None:  # workers (and their cached environments) live until `close`
            self.session = make_executor(self.executor, self.workers, 1, "").session(group_player)
        played = {self._drawn(g): g for g in groups}
        self.fingerprints, rewards, plays = {}, {}, 0
        for drawn, results in self.session.map(list(played)):
            group, each = played[drawn], max(1, self.draws)
            if not results:  # the replay no longer reaches this point: one reward for all, so no advantage
                rewards[group], self.fingerprints[group] = [0.0] * len(group.decisions), set()
                self.stats["unreached"] += 1
                continue
            plays += len(results)
            per_play = [
                float(success) - self.rollback_cost * rollbacks - self.call_cost * calls
                for success, _score, rollbacks, calls, _steps, _origin in results
            ]
            rewards[group] = [sum(per_play[i : i + each]) / each for i in range(0, len(per_play), each)]
            self.fingerprints[group] = {origin for *_, origin in results}
        self._count(len(groups), plays, time.perf_counter() - start)
        return rewards

    def _drawn(self, group: Group) -> Group:
        """The plays of a group: each decision once (the agent's own future), or with `draws` K, each
        decision K times with the agent's noise drawn afresh (1..K), so that a reward is the decision's
        expected outcome and not the luck of the one future that followed it."""
        if not self.draws:
            return group
        return replace(
            group, decisions=tuple(replace(d, draw=k) for d in group.decisions for k in range(1, self.draws + 1))
        )

    @staticmethod
    def _groups(forced: list[Forced | None], job: list[str], review_index: list[int]) -> dict[Group, list[int]]:
        """Sample indices by decision point (a sample that states no decision is not played)."""
        members: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, f in enumerate(forced):
            if f is not None:
                if not job[i]:
                    raise UserInputError(
                        "a GRPO row has no decision point to branch from (meta.job): rebuild the data with this "
                        "version's `rir build-data` for --reward online"
                    )
                members[(job[i], int(review_index[i]))].append(i)
        return {Group(j, k, tuple(forced[i] for i in idx)): idx for (j, k), idx in members.items()}  # type: ignore[misc]

    def close(self) -> None:
        """Stop the workers that play decisions out (called when training ends)."""
        if self.session is not None:
            self.session.close()
            self.session = None

    def _count(self, points: int, played: int, seconds: float) -> None:
        self.stats["points"] += points
        self.stats["restores"] += played
        self.stats["seconds"] += seconds


class OnlineRewardLog(TrainerCallback):
    """Adds the online rewards' cost to the trainer's logs: restored decision points and played decisions
    per logging step, and restores per second of reward time; stops the reward's workers at the end."""

    def __init__(self, reward: OnlineReward) -> None:
        self.reward = reward  # counted from here: what ran before training (screening points) is not a step's
        self.seen = {k: reward.stats[k] for k in ("points", "restores", "seconds", "unreached")}

    def on_train_end(self, args, state, control, **kwargs):
        self.reward.close()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        now = {k: self.reward.stats[k] for k in self.seen}
        delta = {k: now[k] - self.seen[k] for k in now}
        self.seen = now
        seconds = delta["seconds"]
        extra = {
            "online/decision_points": delta["points"],
            "online/reward_evaluations": delta["restores"],
            "online/unreached_points": delta["unreached"],
            "online/reward_seconds": round(seconds, 3),
            "online/restores_per_s": round(delta["restores"] / seconds, 3) if seconds else 0.0,
        }
        add_to_log(state, logs, extra)
