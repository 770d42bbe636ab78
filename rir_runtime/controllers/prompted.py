"""Model-backed controllers: any model through a backend (`prompted:`), or a base model with a LoRA
adapter (`tuned:`), ranking closed answers where the backend can score and generating otherwise."""

from __future__ import annotations

from rir_runtime.controllers.rules import default_value
from rir_runtime.decisions import ANSWER_OPENING, Decision, DecisionKind, Review, parse
from rir_runtime.errors import ParseError
from rir_runtime.llm.base import Backend
from rir_runtime.prompts import DecisionContext, content_tokens, fit_decision
from rir_runtime.structured import fill_reflection, grounded

# A model controller's prompt budget when nothing says otherwise (a tuned adapter's card does).
DEFAULT_PROMPT_TOKENS = 2048


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


def card_prompt_tokens(card: dict) -> int:
    """The prompt budget an adapter serves with: the one its training rows were fitted to (its card's
    `max_prompt_tokens`), else the runtime default. A longer prompt than training saw costs time and
    shows the adapter situations unlike its data."""
    return int(card.get("max_prompt_tokens") or DEFAULT_PROMPT_TOKENS)
