"""Decision points: every review of a recorded episode, with the branch, memory and budget as the
controller met them there (rebuilt by `rir_runtime.trace.replay`). Hindsight labels, agent values and
the dataset rows are all made per decision point.
"""

from __future__ import annotations

from dataclasses import dataclass

from rir_runtime.decisions import Reflection
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.checkpoints import Step
from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace import EpisodeRecord, RespondEvent, ReviewPoint, RollbackCallEvent, StepEvent, replay


@dataclass(frozen=True)
class DecisionPoint:
    """One review of a recorded episode, with the branch as the controller saw it (`replay`)."""

    record: EpisodeRecord
    objective: str
    review: ReviewPoint
    source_run: str = ""  # the rollout folder the episode came from
    max_score: float | None = None

    @property
    def id(self) -> str:
        return f"{self.record.episode_id}#review{self.review.index}"

    @property
    def task(self) -> TaskSpec:
        return self.record.task_spec

    @property
    def history(self) -> tuple[Step, ...]:
        return self.review.steps

    @property
    def observation(self) -> str:
        return self.review.observation

    @property
    def trigger(self) -> str:
        return self.review.review.trigger

    @property
    def memory(self) -> MemorySnapshot:
        return self.review.memory

    @property
    def calls_left(self) -> int:
        """The agent calls the episode had left at this review: its budget less the actions, final
        responses and rollback calls before it (a continuation cannot outlast them)."""
        spent = 0
        for event in self.record.events:
            if event is self.review.review:
                break
            spent += isinstance(event, StepEvent | RespondEvent | RollbackCallEvent)
        return max(0, self.record.budget_agent - spent)

    @property
    def chosen_step(self) -> int | None:
        """The restore point the controller chose, if it recovered."""
        return self.review.locate.step if self.review.locate else None

    @property
    def reflection(self) -> Reflection | None:
        """The reflection the controller wrote, if it recovered with memory."""
        return self.review.reflect.reflection if self.review.reflect else None


def decision_points(record: EpisodeRecord, source_run: str = "") -> list[DecisionPoint]:
    """Every review of an episode with the branch as it stood (`rir_runtime.trace.replay`)."""
    trace = replay(record)
    return [DecisionPoint(record, trace.objective, point, source_run, trace.max_score) for point in trace.reviews]


def ended(point: DecisionPoint) -> bool:
    """Whether the branch had ended when the review came (won, lost, or a terminal review of an
    episode that ended otherwise, e.g. ScienceWorld's completion below the maximum score)."""
    h = point.history
    return bool(h) and (h[-1].won or h[-1].lost) or point.trigger == "terminal"
