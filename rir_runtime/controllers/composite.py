"""Controllers made of others: per-module swaps, and the review gates of a model-backed controller."""

from __future__ import annotations

from rir_runtime.controllers.base import Controller
from rir_runtime.controllers.rules import failure_signal, rule_review
from rir_runtime.controllers.spec import GATES
from rir_runtime.decisions import Decision, Review
from rir_runtime.errors import UnknownNameError
from rir_runtime.prompts import DecisionContext


class CompositeController:
    """Per-module swaps: When from one controller, Where from another, What from a third."""

    def __init__(self, when: Controller, where: Controller, what: Controller) -> None:
        self.when, self.where, self.what = when, where, what
        self.name = f"when={when.name},where={where.name},what={what.name}"
        self.uses_model = when.uses_model or where.uses_model or what.uses_model
        self.uses_hindsight = when.uses_hindsight or where.uses_hindsight or what.uses_hindsight
        self.hindsight_draws = max(getattr(c, "hindsight_draws", 0) for c in (when, where, what))

    def review(self, ctx: DecisionContext) -> Decision:
        return self.when.review(ctx)

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        return self.where.locate_coarse(ctx)

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        return self.where.locate_fine(ctx)

    def reflect(self, ctx: DecisionContext) -> Decision:
        return self.what.reflect(ctx)


class SignalGatedController(CompositeController):
    """A model-backed controller whose reviews reach the model on one side of the
    heuristic's failure signals only, since B_agent pays for the controller's calls as for the
    agent's. `gated:` asks the model only when the branch shows a signal (urgent or not); a quiet
    branch goes on without a call, as most quiet reviews answer "continue" anyway. `residual:` is
    the complement: where a signal shows (at any review) the heuristic's rule decides, free, and the model reviews
    only the quiet branches the rules cannot see into. A review the agent asks for (its rollback
    tool) always reaches the model; Where and What are the wrapped controller's."""

    def __init__(self, inner: Controller, gate: str = "gated") -> None:
        if gate not in GATES:
            raise UnknownNameError("review gate", gate, list(GATES))
        super().__init__(inner, inner, inner)
        self.gate = gate
        self.name = f"{gate}:{inner.name}"

    def review(self, ctx: DecisionContext) -> Decision:
        if ctx.trigger == "agent":
            return self.when.review(ctx)
        signal = failure_signal(ctx)
        if self.gate == "gated" and signal is None and ctx.trigger == "schedule":
            return Decision("review", Review("continue", "no failure signal: the model was not asked"))
        if self.gate == "residual" and signal is not None:
            rule = rule_review(signal, ctx.trigger)
            reason = f"{rule.reason} (the rule decided; the model was not asked)"
            return Decision("review", Review(rule.decision, reason))
        return self.when.review(ctx)
