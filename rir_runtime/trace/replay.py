"""Rebuild the branch at every moment of a recorded episode: one replay for every reader.

Steps append to the branch; a restore to checkpoint r (k > 0) abandons the steps from r on. From
one pass over the events come the branches (each abandoned one and the last) and the review
points (each review, the branch and memory the controller saw, and the Where / What / restore that
followed it). Hindsight labelling, mistake analysis and restore-landing statistics all read
episodes through `replay`, so they agree on what the branch was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rir_runtime.envs.checkpoints import Step
from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace.events import (
    LocateEvent,
    ReflectEvent,
    ResetEvent,
    RestoreEvent,
    ReviewEvent,
    StepEvent,
)
from rir_runtime.trace.record import EpisodeRecord, TraceError


@dataclass(frozen=True)
class Branch:
    """A stretch of steps from the initial state, ended by a restore or by the episode's end."""

    steps: tuple[Step, ...]
    ended_by: str  # "restore", or the episode's stop reason for the last branch
    restore_to: int | None = None  # where the restore that ended it went

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.steps]


@dataclass(frozen=True)
class ReviewPoint:
    """One review with the branch as the controller saw it, and what the recovery then did."""

    index: int  # 0 for the episode's first review
    review: ReviewEvent
    steps: tuple[Step, ...]
    observation: str
    memory: MemorySnapshot  # before this review's own reflection was added
    locate: LocateEvent | None = None
    reflect: ReflectEvent | None = None
    restore: RestoreEvent | None = None


@dataclass(frozen=True)
class Replay:
    objective: str
    initial_observation: str
    branches: tuple[Branch, ...]
    reviews: tuple[ReviewPoint, ...]
    max_score: float | None = None


def replay(record: EpisodeRecord) -> Replay:
    """Walk the events once; `TraceError` if they contradict each other (a step out of order)."""
    steps: tuple[Step, ...] = ()
    objective = initial = observation = ""
    max_score: float | None = None
    memory = MemorySnapshot()
    branches: list[Branch] = []
    reviews: list[ReviewPoint] = []
    for event in record.events:
        if isinstance(event, ResetEvent):
            objective, initial, observation = event.objective, event.observation, event.observation
            max_score = event.max_score
        elif isinstance(event, StepEvent):
            if event.t != len(steps) + 1:
                raise TraceError(
                    f"episode {record.episode_id}: step event at t={event.t} on a branch of {len(steps)} steps"
                )
            steps += (_step(len(steps), event),)
            observation = event.observation
        elif isinstance(event, ReviewEvent):
            reviews.append(ReviewPoint(len(reviews), event, steps, observation, memory))
        elif isinstance(event, LocateEvent) and reviews:
            reviews[-1] = replace(reviews[-1], locate=event)
        elif isinstance(event, ReflectEvent):
            if reviews:
                reviews[-1] = replace(reviews[-1], reflect=event)
            memory = event.memory
        elif isinstance(event, RestoreEvent):
            if reviews:
                reviews[-1] = replace(reviews[-1], restore=event)
            if event.k > 0:
                branches.append(Branch(steps, "restore", event.to))
                steps = steps[: event.to]
                observation = steps[-1].observation if steps else initial
    branches.append(Branch(steps, record.stop_reason))
    return Replay(objective, initial, tuple(branches), tuple(reviews), max_score)


def _step(index: int, event: StepEvent) -> Step:
    return Step(index, event.action, event.observation, event.score, event.won, event.lost, event.injected_error)
