"""The value controller (`value:<adapter>`): a When and a Where that act on the value of each option.

A failure critic says how likely the branch is to fail; an intervention pays only where its expected
gain beats its disruption. So this controller scores every option of the decision, {continue} and
{recover to checkpoint i with the lesson for step i} (`rir_runtime/controllers/options.py`), with a model
trained on the options' hindsight values (`rir train value`: a scalar head, or the language model's own
head scoring each option's log-probability), and recovers where the best
recovery beats continuing by the margin calibrated in its card, to that recovery's checkpoint. The
options share the trajectory prompt, so one batched pass over its cache scores them all: a review
and the Where after it cost one model call, and the Where answers the runtime's coarse question (the
segment) and fine one (the checkpoint) from that pass. The What stays the rule's record of the
restored step, the lesson the option named. An adapter trained on the Where's decisions alone
(`decision_types: [locate]`) leaves the When to the rule: it is asked only where the rule recovers.
"""

from __future__ import annotations

from typing import Protocol

from rir_runtime.controllers.heuristic import HeuristicController
from rir_runtime.controllers.options import option_text, value_prompt
from rir_runtime.controllers.rules import latest_admissible_in, segments_containing
from rir_runtime.decisions import Decision, Review
from rir_runtime.prompts import DecisionContext, approx_tokens

DEFAULT_MAX_OPTIONS = 128


class OptionScorer(Protocol):
    def score(self, prompt: str, options: list[str]) -> list[float]: ...


class ValueController(HeuristicController):
    """Recover where max_i score(restore i) - score(continue) > margin, to the best-scored checkpoint."""

    uses_model = True
    uses_hindsight = False

    def __init__(
        self,
        scorer: OptionScorer,
        name: str,
        margin: float = 0.0,
        max_options: int = DEFAULT_MAX_OPTIONS,
        where_only: bool = False,
    ):
        self.scorer, self.name, self.margin, self.max_options = scorer, name, margin, max(2, max_options)
        self.where_only = where_only  # a model trained on the Where's decisions alone: the rule's When
        self._picked: dict[tuple[tuple[str, ...], str], int] = {}  # a review's restore point, for its Where

    @staticmethod
    def _key(ctx: DecisionContext) -> tuple[tuple[str, ...], str]:
        return tuple(s.action for s in ctx.history), ctx.memory

    def _scores(self, ctx: DecisionContext, checkpoints: list[int], with_continue: bool) -> dict[int | None, float]:
        """Scores of continuing (key None) and of recovering to each checkpoint, in one batched pass."""
        options: list[int | None] = ([None] if with_continue else []) + sorted(checkpoints, reverse=True)
        texts = [option_text(ctx, o) for o in options]
        return dict(zip(options, self.scorer.score(value_prompt(ctx), texts), strict=True))

    def _considered(self, ctx: DecisionContext) -> list[int]:
        """The checkpoints valued: all admissible ones, or on a branch longer than `max_options` the latest
        ones and the start (an option's value is a spike at the step to blame, so sampling every k-th
        checkpoint would miss it; scoring one more option costs a few tokens over the shared cache)."""
        admissible = sorted(ctx.admissible)
        if len(admissible) <= self.max_options:
            return admissible
        return sorted({admissible[0], *admissible[-(self.max_options - 1) :]})

    def _decide_restore(self, ctx: DecisionContext, with_continue: bool) -> tuple[int, float | None, int]:
        """(the checkpoint to restore to, its gain over continuing or None, prompt tokens)."""
        scores = self._scores(ctx, self._considered(ctx), with_continue)
        restores = {c: v for c, v in scores.items() if c is not None}
        r = max(restores, key=lambda c: (restores[c], c))  # ties: the latest, which keeps most progress
        self._picked[self._key(ctx)] = r
        gain = restores[r] - scores[None] if with_continue else None
        return r, gain, approx_tokens([{"role": "user", "content": value_prompt(ctx)}])

    def review(self, ctx: DecisionContext) -> Decision:
        if self.where_only:
            return super().review(ctx)
        if not ctx.admissible:
            return Decision("review", Review("continue", "no admissible checkpoint"))
        r, gain, tokens = self._decide_restore(ctx, with_continue=True)
        assert gain is not None
        recover = gain > self.margin
        reason = f"recovering to {r} ({option_text(ctx, r)}) scores {gain:+.2f} over going on"
        verdict = Review("recover" if recover else "continue", reason)
        return Decision(
            "review", verdict, "", 0, 1, tokens, 0, {"margin": gain, "threshold": self.margin, "restore": r}
        )

    def _restore_point(self, ctx: DecisionContext) -> tuple[int, int, int]:
        """(checkpoint, model calls, prompt tokens): the review's pick where it stands, else one pass now
        (after a failed ending the runtime recovers without asking the When)."""
        picked = self._picked.get(self._key(ctx))
        if picked is not None and picked in ctx.admissible:
            return picked, 0, 0
        r, _, tokens = self._decide_restore(ctx, with_continue=False)
        return r, 1, tokens

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        r, calls, tokens = self._restore_point(ctx)
        return Decision("locate_coarse", segments_containing(ctx, r), "", 0, calls, tokens, 0, {"restore": r})

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        r, calls, tokens = self._restore_point(ctx)
        a, b = ctx.segment or (0, len(ctx.history) + 1)
        return Decision("locate_fine", r if a <= r < b else latest_admissible_in(ctx), "", 0, calls, tokens, 0)
