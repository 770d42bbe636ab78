"""The heuristic controller (rules only), and its exploratory variants for data generation."""

from __future__ import annotations

from rir_runtime.controllers.rules import (
    failure_signal,
    latest_admissible_in,
    reflection_for,
    rule_review,
    segments_containing,
    suspect_step,
)
from rir_runtime.decisions import Decision, Review
from rir_runtime.prompts import DecisionContext


class HeuristicController:
    """Rules only: recover on a visible failure signal; blame the suspect step; reflect on it."""

    name = "heuristic"
    uses_model = False
    uses_hindsight = False

    def review(self, ctx: DecisionContext) -> Decision:
        return Decision("review", rule_review(failure_signal(ctx), ctx.trigger))

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        return Decision("locate_coarse", segments_containing(ctx, suspect_step(ctx)))

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        a, b = ctx.segment or (0, len(ctx.history) + 1)
        step = suspect_step(ctx)
        return Decision("locate_fine", step if a <= step < b else latest_admissible_in(ctx))

    def reflect(self, ctx: DecisionContext) -> Decision:
        return Decision("reflect", reflection_for(ctx, ctx.restore_point or 0))


class ExploringController(HeuristicController):
    """Exploratory variants for data generation: random review verdicts and/or random restore
    points, so the data holds decisions the heuristic would never make (and their outcomes).
    Draws are seeded by the branch, so a rerun makes the same choices."""

    def __init__(self, random_review: bool, random_restore: bool, p_recover: float = 0.3) -> None:
        self.random_review, self.random_restore, self.p_recover = random_review, random_restore, p_recover
        self.name = (
            "random-review"
            if random_review and not random_restore
            else ("random-restore" if random_restore and not random_review else "random")
        )

    def _draw(self, ctx: DecisionContext, salt: str) -> float:
        from rir_runtime.policies import unit_draw

        return unit_draw(salt, ctx.task, "|".join(s.action for s in ctx.history))

    def review(self, ctx: DecisionContext) -> Decision:
        if not self.random_review:
            return super().review(ctx)
        recover = self._draw(ctx, "review") < self.p_recover or bool(ctx.history and ctx.history[-1].lost)
        return Decision("review", Review("recover" if recover else "continue", "exploration"))

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        if not self.random_restore:
            return super().locate_coarse(ctx)
        return Decision("locate_coarse", int(self._draw(ctx, "coarse") * max(len(ctx.segments), 1)))

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        if not self.random_restore:
            return super().locate_fine(ctx)
        a, b = ctx.segment or (0, len(ctx.history) + 1)
        inside = [i for i in ctx.admissible if a <= i < b] or list(ctx.admissible)
        return Decision("locate_fine", inside[int(self._draw(ctx, "fine") * len(inside))])
