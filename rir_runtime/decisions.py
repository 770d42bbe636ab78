"""Controller decisions as JSON, so prompted, tuned and oracle controllers are interchangeable and
the same text is the training target.

- review: {"decision": "continue" | "recover", "reason": str}
- locate (coarse): {"segment": int}; (fine): {"step": int}
- reflect: {"env_knowledge": [str], "milestones": [str],
            "failure": {"condition": str, "action": str, "outcome": str, "lesson": str}}
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

from rir_runtime.errors import ParseError

DecisionKind = Literal["review", "locate_coarse", "locate_fine", "reflect"]

# The fixed opening of each closed-set answer (`dump` writes it first): a ranking controller scores
# what follows it, and GRPO's prefilled prompts end with it, so both see the same tokens.
ANSWER_OPENING: dict[DecisionKind, str] = {
    "review": '{"decision": "',
    "locate_coarse": '{"segment": ',
    "locate_fine": '{"step": ',
}

ReviewDecision = Literal["continue", "recover"]


@dataclass(frozen=True)
class Review:
    decision: ReviewDecision
    reason: str = ""

    @property
    def recover(self) -> bool:
        return self.decision == "recover"


@dataclass(frozen=True)
class Failure:
    """A conditioned failure analysis: in `condition`, `action` led to `outcome`; `lesson` says what to do."""

    condition: str
    action: str
    outcome: str
    lesson: str


def avoid_lesson(action: str) -> str:
    """The lesson the heuristic writes and the hindsight reflections teach: one wording, so that the
    training rows and the rule's records say the same thing."""
    return f"in that situation do not '{action}'; choose a different action"


@dataclass(frozen=True)
class Reflection:
    env_knowledge: tuple[str, ...] = ()
    milestones: tuple[str, ...] = ()
    failure: Failure | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "env_knowledge": list(self.env_knowledge),
            "milestones": list(self.milestones),
            "failure": asdict(self.failure) if self.failure else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reflection:
        """The inverse of `to_json` (trace files); `parse` is for model replies."""
        failure = data.get("failure")
        return cls(
            tuple(data.get("env_knowledge", ())),
            tuple(data.get("milestones", ())),
            Failure(**failure) if failure else None,
        )

    def as_text(self) -> str:
        """The free-text form used by the text-memory presets (self-refine, reflexion)."""
        parts = []
        if self.failure:
            f = self.failure
            parts.append(f"Last attempt: when {f.condition}, doing '{f.action}' led to: {f.outcome}. {f.lesson}")
        parts += list(self.env_knowledge) + [f"Reached: {m}" for m in self.milestones]
        return " ".join(parts)


@dataclass(frozen=True)
class Decision:
    """A controller's answer plus bookkeeping: raw text, whether parsing failed, tokens used."""

    kind: DecisionKind
    value: Any
    raw: str = ""
    parse_failures: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def dump(kind: DecisionKind, value: Any) -> str:
    """The canonical JSON text of a decision (the SFT completion target)."""
    if kind == "review":
        obj: dict[str, Any] = {"decision": value.decision, "reason": value.reason}
    elif kind == "locate_coarse":
        obj = {"segment": int(value)}
    elif kind == "locate_fine":
        obj = {"step": int(value)}
    else:
        obj = value.to_json()
    return json.dumps(obj, ensure_ascii=False)


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
# The prompt's schema shows lists as `[<reusable facts>]`; small models copy that placeholder verbatim.
_COPIED_LIST_PLACEHOLDER = re.compile(r"\[\s*<[^<>\[\]]*>\s*\]")


def _load_object(text: str) -> dict[str, Any]:
    match = _JSON_OBJECT.search(text or "")
    if not match:
        raise ParseError("no JSON object found in the reply; answer with one JSON object only")
    candidate = _COPIED_LIST_PLACEHOLDER.sub("[]", match.group(0))  # a copied placeholder says nothing: empty
    # Models often add trailing prose after the object; shrink from the right until it parses.
    for end in range(len(candidate), 0, -1):
        if candidate[end - 1] != "}":
            continue
        try:
            obj = json.loads(candidate[:end])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ParseError("the reply's JSON object is malformed; answer with one valid JSON object only")


def _as_int(obj: dict[str, Any], key: str) -> int:
    if key not in obj:
        raise ParseError(f'missing key "{key}"; answer like {{"{key}": 3}}')
    try:
        return int(obj[key])
    except (TypeError, ValueError):
        raise ParseError(f'"{key}" must be an integer, got {obj[key]!r}') from None


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if not isinstance(value, list):
        raise ParseError(f'"{key}" must be a list of strings')
    return tuple(str(v).strip() for v in value if str(v).strip())


def parse(kind: DecisionKind, text: str) -> Any:
    """Parse a model reply into the decision value; raises `ParseError` naming what is wrong."""
    obj = _load_object(text)
    if kind == "review":
        decision = str(obj.get("decision", "")).strip().lower()
        if decision not in ("continue", "recover"):
            raise ParseError(f'"decision" must be "continue" or "recover", got {obj.get("decision")!r}')
        return Review(cast(ReviewDecision, decision), str(obj.get("reason", "")))  # checked just above
    if kind == "locate_coarse":
        return _as_int(obj, "segment")
    if kind == "locate_fine":
        return _as_int(obj, "step")
    failure = obj.get("failure")
    parsed_failure = None
    if isinstance(failure, dict) and failure.get("action"):
        parsed_failure = Failure(
            *(str(failure.get(k, "")).strip() for k in ("condition", "action", "outcome", "lesson"))
        )
    elif failure not in (None, {}, ""):
        raise ParseError('"failure" must be an object with condition, action, outcome and lesson, or null')
    return Reflection(
        _str_list(obj.get("env_knowledge"), "env_knowledge"),
        _str_list(obj.get("milestones"), "milestones"),
        parsed_failure,
    )
