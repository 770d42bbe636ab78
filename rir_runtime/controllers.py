"""Recovery controllers: drop-in implementations of When (review), Where (locate) and What (reflect).

Every controller answers the same four calls with a `Decision` whose value has the JSON shape of
`rir_runtime.decisions`, so implementations are interchangeable per module:

- `HeuristicController`: rules, no model.
- `PromptedController`: any model through a backend; one retry on a parse error, then the safe
  default (continue / latest admissible checkpoint / empty reflection), counted.
- `OracleController`: hindsight values by branch re-execution (an upper bound; also labels).
- `AgentOracleController` (`oracle-agent`): the same, valued by continuations of the agent being
  controlled, with a recovery's lesson kept: the upper bound on this agent.
- `CompositeController`: one module from each, e.g. a tuned Where with a prompted When.
- `SignalGatedController` (`gated:<spec>`, `residual:<spec>`): a model-backed controller whose
  scheduled reviews ask the model only when a failure signal is visible (`gated:`), or only when
  none is and the heuristic's rule decides the rest (`residual:`), so fewer reviews cost agent calls.
The `tuned` controller (a base model plus LoRA adapter) is a `PromptedController` over the
adapter's backend; `make_controller` resolves the names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from rir_runtime.decisions import ANSWER_OPENING, Decision, DecisionKind, Reflection, Review, dump, parse
from rir_runtime.errors import ParseError, RIRError, UnknownNameError, UserInputError
from rir_runtime.llm.base import Backend
from rir_runtime.prompts import DecisionContext, content_tokens, ending, fit_decision
from rir_runtime.signals import ERROR_OBSERVATION
from rir_runtime.structured import failure_record, fill_reflection, grounded

if TYPE_CHECKING:
    from rir_runtime.values import Hindsight

# A model controller's prompt budget when nothing says otherwise (a tuned adapter's card does).
DEFAULT_PROMPT_TOKENS = 2048
# Verbs that only look or move: a failure is rarely caused by them.
PASSIVE_VERBS = {
    "look",
    "inventory",
    "examine",
    "read",
    "go",
    "wait",
    "check",
    "task",
    "score",
    "teleport",
    "take",
    "pick",
    "open",
    "close",
}


class Controller(Protocol):
    name: str
    uses_model: bool  # its decisions are model calls, counted against B_agent
    uses_hindsight: bool  # it reads `ctx.hindsight` (the oracle); the loop provides it only then

    def review(self, ctx: DecisionContext) -> Decision: ...
    def locate_coarse(self, ctx: DecisionContext) -> Decision: ...
    def locate_fine(self, ctx: DecisionContext) -> Decision: ...
    def reflect(self, ctx: DecisionContext) -> Decision: ...


# --- shared, model-free pieces ------------------------------------------------------------------
@dataclass(frozen=True)
class FailureSignal:
    """A visible sign of trouble; an `urgent` one is worth a recovery between scheduled reviews."""

    text: str
    urgent: bool = False


def failure_signal(ctx: DecisionContext, stall_steps: int = 8, loop_steps: int = 3) -> FailureSignal | None:
    """A visible sign of trouble in the branch: lost, an ending below the task's maximum score, a
    score drop, an LLM agent stuck repeating one action to the same reply (urgent: each names a
    state worse than before), an error reply, or a stall (which wait for a scheduled review)."""
    h = ctx.history
    if not h:
        return None
    last = h[-1]
    if last.lost:
        return FailureSignal(f"the episode was lost after '{last.action}'", urgent=True)
    if ctx.trigger == "terminal" and (ctx.max_score is not None and ctx.score < ctx.max_score):
        return FailureSignal(ending(ctx), urgent=True)  # ended below the maximum: a visible failure
    if len(h) >= 2 and last.score < h[-2].score:
        return FailureSignal(f"the score dropped after '{last.action}'", urgent=True)
    if len(h) >= loop_steps and len({(s.action, s.observation) for s in h[-loop_steps:]}) == 1:
        return FailureSignal(
            f"'{last.action}' repeated {loop_steps} times to the same reply: the agent is stuck", urgent=True
        )
    if ERROR_OBSERVATION.search(last.observation):
        return FailureSignal(f"'{last.action}' was not possible")
    if len(h) > stall_steps and h[-1].score <= h[-1 - stall_steps].score:
        return FailureSignal(f"no progress in {stall_steps} steps")
    return None


def suspect_step(ctx: DecisionContext) -> int:
    """The step most likely to have caused the trouble (its checkpoint is the restore target).

    A visible symptom that follows an action at once (lost, score drop) blames that action.
    Otherwise the error was silent: blame the latest committing action not already blamed in a
    remembered failure, walking further back on each new failure of the same kind.
    """
    h = ctx.history
    admissible = set(ctx.admissible)
    candidates = h
    if h and (h[-1].lost or (len(h) >= 2 and h[-1].score < h[-2].score)) and h[-1].index in admissible:
        # A symptom that names what the last action touched ("the almond bursts into flames") blames
        # that action; one that does not ("the dish is inedible") points further back.
        words = h[-1].action.lower().split()
        touched = words[-1] if len(words) > 1 else ""  # a bare verb ("combine") touches nothing by name
        if touched and touched in h[-1].observation.lower() and h[-1].action not in ctx.blamed_actions:
            return h[-1].index
        candidates = h[:-1]
    for step in reversed(candidates):
        verb = step.action.split(" ", 1)[0].lower()
        if step.index in admissible and verb not in PASSIVE_VERBS and step.action not in ctx.blamed_actions:
            if not ERROR_OBSERVATION.search(step.observation):
                return step.index
    return max(admissible) if admissible else 0


def reflection_for(ctx: DecisionContext, r: int) -> Reflection:
    """What survives a restore to checkpoint r: the step taken there as a conditioned failure,
    facts learned from failed actions, milestones of the abandoned suffix. No state claims."""
    h = ctx.history
    if not h:
        return Reflection()
    if r >= len(h):  # k = 0: nothing is abandoned; reflect on the most suspect step so far
        r = min(suspect_step(ctx), len(h) - 1)
    knowledge = tuple(
        dict.fromkeys(f"'{s.action}' does nothing useful" for s in h[r:] if ERROR_OBSERVATION.search(s.observation))
    )
    gains = [s for i, s in enumerate(h[r:], start=r) if s.score > (h[i - 1].score if i > 0 else 0)]
    milestones = tuple(f"score {s.score:g} after '{s.action}'" for s in gains[-3:])
    failure = failure_record(h, r)
    return Reflection(knowledge[:3], milestones, failure)


def segments_containing(ctx: DecisionContext, step: int) -> int:
    for i, (a, b) in enumerate(ctx.segments):
        if a <= step < b:
            return i
    return len(ctx.segments) - 1


def latest_admissible_in(ctx: DecisionContext) -> int:
    a, b = ctx.segment or (0, len(ctx.history) + 1)
    inside = [i for i in ctx.admissible if a <= i < b]
    return max(inside) if inside else max(ctx.admissible, default=0)


def default_value(kind: DecisionKind, ctx: DecisionContext) -> object:
    """The safe default when a model's reply cannot be parsed."""
    if kind == "review":
        return Review("continue", "default after unparseable reply")
    if kind == "locate_coarse":
        return max(len(ctx.segments) - 1, 0)
    if kind == "locate_fine":
        return latest_admissible_in(ctx)
    return Reflection()


# --- heuristic ----------------------------------------------------------------------------------
def rule_review(signal: FailureSignal | None, trigger: str) -> Review:
    """The heuristic's When: recover on a visible failure signal (a scheduled review waits for an
    urgent one), else continue."""
    if signal and (trigger != "schedule" or signal.urgent):
        return Review("recover", signal.text)
    return Review("continue", signal.text if signal else "no failure signal")


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


# --- oracle ---------------------------------------------------------------------------------------
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
    `oracle`, valued by the expert's plan, can call a loop the agent never leaves winnable."""

    name = "oracle-agent"
    uses_hindsight = True

    @staticmethod
    def _hindsight(ctx: DecisionContext) -> Hindsight:
        if ctx.hindsight is None:
            raise RIRError("the oracle-agent controller needs hindsight values: run it inside an EpisodeRunner")
        return ctx.hindsight

    def best_restore(self, ctx: DecisionContext) -> tuple[int, float]:
        """The latest admissible checkpoint of highest `V_agent` (with the lesson kept), and that value."""
        values = self._hindsight(ctx).agent_values(list(ctx.admissible))
        best = max(values.values())
        return max(i for i, v in values.items() if i is not None and v == best), best

    def review(self, ctx: DecisionContext) -> Decision:
        if not ctx.admissible:
            return Decision("review", Review("continue", "no admissible checkpoint"))
        now = self._hindsight(ctx).agent_values([None])[None]  # first: the environment stands there already
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


# --- prompted (and tuned) --------------------------------------------------------------------------
def candidates(kind: DecisionKind, ctx: DecisionContext) -> list[tuple[str, object]]:
    """The closed answer set of a review or locate decision, as JSON prefixes of the training
    targets (`dump`), for ranking by likelihood."""
    opening = ANSWER_OPENING.get(kind, "")
    if kind == "review":
        return [
            (f'{opening}continue"', Review("continue", "ranked by likelihood")),
            (f'{opening}recover"', Review("recover", "ranked by likelihood")),
        ]
    if kind == "locate_coarse":
        return [(f"{opening}{i}}}", i) for i in range(len(ctx.segments))]
    a, b = ctx.segment or (0, len(ctx.history) + 1)
    inside = [i for i in ctx.admissible if a <= i < b] or list(ctx.admissible)
    return [(f"{opening}{i}}}", i) for i in inside]


class PromptedController:
    """Any model through a backend; the same renderer builds the training data.

    With `rank=True` (the default when the backend can score) review and locate decisions pick
    the most likely answer of their closed set in one scored forward pass, so a small model never
    produces an unparseable verdict and a CPU spends one prefill per decision instead of a
    decoding loop; reflections are then filled into a fixed JSON skeleton (`structured.py`), so
    they always parse. Without scoring (a remote server) every decision is generated as free
    text, parsed, retried once.
    """

    uses_model = True
    uses_hindsight = False

    def __init__(
        self,
        backend: Backend,
        name: str,
        max_new_tokens: int = 160,
        max_prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
        rank: bool | None = None,
        review_threshold: float = 0.0,
    ) -> None:
        self.backend = backend
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.rank = backend.supports_scoring if rank is None else rank
        # Ranked review: recover when log p(recover) - log p(continue) exceeds this. A tuned adapter's
        # card carries the value calibrated on its validation split; 0 is "the likelier answer".
        self.review_threshold = review_threshold

    def _ask(self, kind: DecisionKind, ctx: DecisionContext) -> Decision:
        options = candidates(kind, ctx) if kind != "reflect" else []
        if len(options) == 1:  # one checkpoint or segment to choose: no call spends the agent's budget on it
            return Decision(kind, options[0][1], options[0][0], meta={"only_answer": True})
        messages = fit_decision(kind, ctx, self.max_prompt_tokens)
        if self.rank and kind == "reflect":
            return fill_reflection(self.backend, messages, ctx)
        if self.rank and options:
            scores = self.backend.score(messages, [text for text, _ in options])
            prompt_tokens = content_tokens(messages)
            if kind == "review":  # options are (continue, recover): compare the margin to the threshold
                margin = scores[1] - scores[0]
                best = 1 if margin > self.review_threshold else 0
                meta = {"ranked": True, "margin": margin, "threshold": self.review_threshold}
                return Decision(kind, options[best][1], options[best][0], 0, 1, prompt_tokens, 0, meta)
            best = max(range(len(options)), key=lambda i: scores[i])
            return Decision(kind, options[best][1], options[best][0], 0, 1, prompt_tokens, 0, {"ranked": True})
        calls = failures = p_tok = c_tok = 0
        raw = ""
        for _attempt in range(2):
            if calls and ctx.calls_left is not None and calls >= ctx.calls_left:
                break  # no call left for the retry: the safe default below
            completion = self.backend.generate([messages], max_new_tokens=self.max_new_tokens)[0]
            calls += 1
            p_tok += completion.prompt_tokens
            c_tok += completion.completion_tokens
            raw = completion.text
            try:
                value = parse(kind, raw)
                if kind == "reflect":  # the record kept is the trajectory's, as on the ranked path
                    value = grounded(value, ctx)
                return Decision(kind, value, raw, failures, calls, p_tok, c_tok)
            except ParseError as err:
                failures += 1
                messages = messages + [
                    {"role": "assistant", "content": raw},
                    {"role": "user", "content": f"That reply could not be parsed: {err}. Reply again with JSON only."},
                ]
        return Decision(kind, default_value(kind, ctx), raw, failures, calls, p_tok, c_tok, {"fallback": True})

    def review(self, ctx: DecisionContext) -> Decision:
        return self._ask("review", ctx)

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        return self._ask("locate_coarse", ctx)

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        return self._ask("locate_fine", ctx)

    def reflect(self, ctx: DecisionContext) -> Decision:
        return self._ask("reflect", ctx)


class CompositeController:
    """Per-module swaps: When from one controller, Where from another, What from a third."""

    def __init__(self, when: Controller, where: Controller, what: Controller) -> None:
        self.when, self.where, self.what = when, where, what
        self.name = f"when={when.name},where={where.name},what={what.name}"
        self.uses_model = when.uses_model or where.uses_model or what.uses_model
        self.uses_hindsight = when.uses_hindsight or where.uses_hindsight or what.uses_hindsight

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


# The review gates a model-backed controller can be wrapped in (see SignalGatedController).
GATES = ("gated", "residual")


def gated_spec(spec: str) -> tuple[str, str] | None:
    """The gate and the model-backed controller a `gated:<spec>` or `residual:<spec>` name wraps, or
    None when `spec` is not one (a rule-based controller has no model calls for a gate to save)."""
    kind, _, inner = spec.partition(":")
    return (kind, inner) if kind in GATES and inner.startswith(("prompted:", "tuned:")) else None


CONTROLLER_KINDS = (
    "heuristic",
    "oracle",
    "oracle-agent",
    "prompted:<model>",
    "tuned:<adapter-folder>",
    "gated:<prompted or tuned controller>",
    "residual:<prompted or tuned controller>",
    "random-review",
    "random-restore",
)


def card_prompt_tokens(card: dict) -> int:
    """The prompt budget an adapter serves with: the one its training rows were fitted to (its card's
    `max_prompt_tokens`), else the runtime default. A longer prompt than training saw costs time and
    shows the adapter situations unlike its data."""
    return int(card.get("max_prompt_tokens") or DEFAULT_PROMPT_TOKENS)


def make_controller(spec: str, backend_factory: Callable[[str], Backend] | None = None) -> Controller:
    """Resolve a controller name. `when=A;where=B;what=C` composes modules from three controllers."""
    if ";" in spec:
        parts = dict(p.split("=", 1) for p in spec.split(";") if "=" in p)
        missing = {"when", "where", "what"} - set(parts)
        if missing:
            raise UnknownNameError("composite controller part", ",".join(sorted(missing)), ["when", "where", "what"])
        return CompositeController(*(make_controller(parts[k], backend_factory) for k in ("when", "where", "what")))
    gated = gated_spec(spec)
    if gated is not None:
        gate, inner = gated
        return SignalGatedController(make_controller(inner, backend_factory), gate)
    kind, _, arg = spec.partition(":")
    if kind == "heuristic":
        return HeuristicController()
    if kind == "oracle":
        return OracleController()
    if kind == "oracle-agent":
        return AgentOracleController()
    if kind in ("random-review", "random-restore"):
        return ExploringController(kind == "random-review", kind == "random-restore")
    if kind in ("prompted", "tuned") and arg:
        from rir_runtime.llm import make_backend

        factory = backend_factory or make_backend
        if kind == "prompted":
            return PromptedController(factory(arg), name=spec)
        from rir_runtime.llm.tuned import read_card

        # `tuned:<dir>` keeps its prefix: the backend factory loads base + adapter after checking its card
        card = read_card(arg)
        threshold = card.get("review_threshold", 0.0)
        if threshold is None:  # written before calibration, which did not finish
            raise UserInputError(
                f"adapter {arg.removeprefix('tuned:')} has no calibrated review threshold (training stopped while "
                "calibrating): rerun the same `rir train` command; it resumes from the last checkpoint and calibrates"
            )
        return PromptedController(
            factory(spec), name=spec, max_prompt_tokens=card_prompt_tokens(card), review_threshold=float(threshold)
        )
    raise UnknownNameError("controller", spec, list(CONTROLLER_KINDS))


__all__ = [
    "AgentOracleController",
    "CompositeController",
    "Controller",
    "HeuristicController",
    "OracleController",
    "PromptedController",
    "SignalGatedController",
    "dump",
    "make_controller",
]


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
        from rir_runtime.policies import _unit

        return _unit(salt, ctx.task, "|".join(s.action for s in ctx.history))

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
