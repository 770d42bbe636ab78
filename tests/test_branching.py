"""Branching at a decision point: every decision starts from one restored state, and a branch that
makes the decision the episode made plays out exactly as the episode did."""

from __future__ import annotations

from rir_runtime.branching import Forced
from rir_runtime.envs import TaskSpec
from rir_runtime.orchestration.jobs import EpisodeJob, branch_job, run_job
from rir_runtime.trace import replay


def job(variation: int, task: str = "workshop-4", budget_rollback: int = 2) -> EpisodeJob:
    return EpisodeJob(TaskSpec("builtin", task, "dev", variation), "rir", "heuristic", "noisy-expert", "rank",
                      0.25, 0, "40", budget_rollback, 100, 4)  # fmt: skip


def recorded_decision(record, index: int) -> Forced:
    """The decision the episode made at its review `index`, as a branch would force it."""
    point = replay(record).reviews[index]
    if point.review.decision == "continue":
        return Forced(False)
    return Forced(True, point.locate.step if point.locate else None)


def test_a_branch_that_decides_as_the_episode_did_plays_out_as_it_did() -> None:
    checked = 0
    for variation in range(12):
        original = run_job(job(variation))
        for index in range(len(replay(original).reviews)):
            (outcome,) = branch_job(job(variation), index, [recorded_decision(original, index)])
            # the forced review's reason says "branch": everything else, every later event included, is the same
            same = [
                (type(a), getattr(a, "decision", None), getattr(a, "action", None), getattr(a, "to", None))
                for a in original.events
            ] == [
                (type(b), getattr(b, "decision", None), getattr(b, "action", None), getattr(b, "to", None))
                for b in outcome.record.events
            ]
            assert same and outcome.success == original.success, (variation, index)
            checked += 1
    assert checked >= 10


def test_a_groups_decisions_all_start_from_one_state_and_can_end_differently() -> None:
    differ = 0
    for variation in range(12):
        original = run_job(job(variation))
        reviews = replay(original).reviews
        for index, point in enumerate(reviews):
            if point.review.trigger == "terminal":
                continue
            decisions = [Forced(False), Forced(True), *(Forced(True, i) for i in range(0, len(point.steps) + 1, 3))]
            outcomes = branch_job(job(variation), index, decisions)
            assert len({o.fingerprint for o in outcomes}) == 1, (variation, index)
            assert [o.decision for o in outcomes] == decisions
            assert all(o.rollbacks == 0 for o in outcomes if not o.decision.recover and o.record.rollbacks == 0)
            differ += len({o.success for o in outcomes}) > 1
    assert differ >= 1  # somewhere the decision decides the episode


def test_branching_from_a_review_the_episode_never_reached_says_so() -> None:
    import pytest

    from rir_runtime.errors import UserInputError

    with pytest.raises(UserInputError, match="ended before its review 99"):
        branch_job(job(0), 99, [Forced(False)])
