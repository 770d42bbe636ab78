"""The oracles: controllers that read hindsight values (upper bounds, and the labels' source)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from rir_runtime.controllers.heuristic import HeuristicController
from rir_runtime.controllers.rules import latest_admissible_in, segments_containing
from rir_runtime.decisions import Decision, Review
from rir_runtime.errors import RIRError
from rir_runtime.prompts import DecisionContext

if TYPE_CHECKING:
    from rir_runtime.values import Hindsight


class OracleController(HeuristicController):
    """Hindsight: `ctx.hindsight.value(i)` re-executes the expert plan from checkpoint i. The loop
    passes that view of the future in the context of this controller's decisions only."""

    name = "oracle"
    uses_hindsight = True

    def __init__(self) -> None:
        self._best: dict[tuple[str, ...], int] = {}

    @staticmethod
    def _value(ctx: DecisionContext) -> Callable[[int], float]:
        if ctx.hindsight is None:
            raise RIRError("the oracle controller needs hindsight values: run it inside an EpisodeRunner")
        return ctx.hindsight.value

    def _best_restore(self, ctx: DecisionContext) -> int:
        from rir_runtime.values import latest_best_bisect

        key = tuple(s.action for s in ctx.history)
        if key not in self._best:
            self._best = {key: latest_best_bisect(list(ctx.admissible), self._value(ctx))[0]}
        return self._best[key]

    def review(self, ctx: DecisionContext) -> Decision:
        value = self._value(ctx)
        now = len(ctx.history)
        if ctx.history and ctx.history[-1].lost or now not in ctx.admissible or value(now) == 0.0:
            best = self._best_restore(ctx) if ctx.admissible else None
            if best is not None and value(best) > 0.0:
                return Decision("review", Review("recover", f"success is still possible from checkpoint {best}"))
        return Decision("review", Review("continue", "the branch can still succeed"))

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        return Decision("locate_coarse", segments_containing(ctx, self._best_restore(ctx)))

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        return Decision("locate_fine", self._best_restore(ctx))


class AgentOracleController(HeuristicController):
    """Hindsight relative to the agent being controlled: `V_agent` of continuing and of a recovery to
    each admissible checkpoint with its lesson kept, by continuations of this very agent
    (`ctx.hindsight.agent_value`). It recovers where a recovery beats continuing, to the latest
    checkpoint of highest value, and its What is the rule's record of that step: the lesson its values
    assumed. Its success minus the heuristic's is the room a learned When and Where has on this agent;
    `oracle`, valued by the expert's plan, can call a loop the agent never leaves winnable.

    `oracle-agent` plays the agent's own future (continuation 0: the very mistakes it will make), so
    it also knows the agent's luck, which no controller reading the trajectory can. `oracle-agent:<K>`
    values each option by K continuations that draw the agent's noise afresh (1..K): the expected value
    of a decision, the bound for a controller that foresees no particular draw."""

    uses_hindsight = True

    def __init__(self, draws: int = 0) -> None:
        self.hindsight_draws = draws  # 0: the agent's own future; K: K fresh draws of its noise
        self.name = f"oracle-agent:{draws}" if draws else "oracle-agent"

    @staticmethod
    def _hindsight(ctx: DecisionContext) -> Hindsight:
        if ctx.hindsight is None:
            raise RIRError("the oracle-agent controller needs hindsight values: run it inside an EpisodeRunner")
        return ctx.hindsight

    def best_restore(self, ctx: DecisionContext) -> tuple[int, float]:
        """The latest admissible checkpoint of highest `V_agent` (with the lesson kept), and that value."""
        return self._hindsight(ctx).best_agent_restore(list(ctx.admissible))

    def review(self, ctx: DecisionContext) -> Decision:
        if not ctx.admissible:
            return Decision("review", Review("continue", "no admissible checkpoint"))
        now = self._hindsight(ctx).agent_values([None])[None]  # first: the environment stands there already
        if now >= 1.0:  # no recovery can do better than always winning: no need to value one
            return Decision("review", Review("continue", f"no recovery beats continuing ({now:.0%})"))
        r, best = self.best_restore(ctx)
        if best > now:
            return Decision("review", Review("recover", f"a recovery to {r} succeeds {best:.0%}, continuing {now:.0%}"))
        return Decision("review", Review("continue", f"no recovery beats continuing ({now:.0%})"))

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        return Decision("locate_coarse", segments_containing(ctx, self.best_restore(ctx)[0]))

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        a, b = ctx.segment or (0, len(ctx.history) + 1)
        inside = replace(ctx, admissible=tuple(i for i in ctx.admissible if a <= i < b))
        return Decision("locate_fine", self.best_restore(inside)[0] if inside.admissible else latest_admissible_in(ctx))
