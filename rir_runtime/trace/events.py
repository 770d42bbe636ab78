"""The events of an episode trace, one frozen dataclass per kind.

The loop appends them as it runs; labelling, mistake analysis and reports read them back through
`rir_runtime.trace.read_records` and `replay`, never as loose dicts. Every event carries `t`, the
length of the branch when it happened (a step event's `t` counts the step itself). On disk an
event is one JSON object whose `type` names its class here.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from rir_runtime.decisions import Reflection
from rir_runtime.envs.base import RowChange
from rir_runtime.memory import MemorySnapshot


class TraceFormatError(ValueError):
    """An event or record that does not match the schema; the reader adds the file and line."""


@dataclass(frozen=True)
class Event:
    t: int
    type: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, **{f.name: _plain(getattr(self, f.name)) for f in fields(self)}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        """Build from the JSON form, checking names and scalar types (nested values: `_nested`)."""
        hints = type_hints(cls)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"type"})
        if unknown:
            raise TraceFormatError(f"'{cls.type}' event has unknown field(s) {unknown}")
        values = {}
        for name, value in data.items():
            if name == "type":
                continue
            values[name] = (
                cls._nested(name, value) if name in cls._NESTED else check_scalar(cls.type, name, value, hints)
            )
        try:
            return cls(**values)
        except TypeError as err:  # a required field is missing
            raise TraceFormatError(f"'{cls.type}' event: {err}") from None

    _NESTED: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def _nested(cls, name: str, value: Any) -> Any:
        raise NotImplementedError


# --- the agent's side -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResetEvent(Event):
    """The episode started: the first observation, the task objective and its highest score."""

    observation: str
    objective: str
    max_score: float | None = None
    type: ClassVar[str] = "reset"


@dataclass(frozen=True)
class StepEvent(Event):
    """An executed action and what the environment answered."""

    action: str
    observation: str
    score: float
    won: bool = False
    lost: bool = False
    injected_error: bool = False  # the error-injected expert's deliberate mistake (ground truth)
    changes: tuple[RowChange, ...] = ()  # the rows a database env's step changed (`StepResult.info`)
    type: ClassVar[str] = "step"
    _NESTED: ClassVar[frozenset[str]] = frozenset({"changes"})

    def to_json(self) -> dict[str, Any]:
        """Without `changes` when there are none: most envs report none, and their lines stay as they were."""
        data = super().to_json()
        if not self.changes:
            del data["changes"]
        return data

    @classmethod
    def _nested(cls, name: str, value: Any) -> Any:
        if value is None:  # a Parquet row (`rir export`) holds null for a step that changed nothing
            return ()
        if not isinstance(value, list):
            raise TraceFormatError(f"'step' event: changes must be a list, got {value!r}")
        try:
            return tuple(RowChange.from_json(v) for v in value)
        except ValueError as err:
            raise TraceFormatError(f"'step' event: {err}") from None


@dataclass(frozen=True)
class GuidanceEvent(Event):
    """Memory guidance acted on the next action: which candidates it warned against (and why), the
    log-probability it took off each (None: excluded), and what the agent would have done without it."""

    mode: str
    warned: tuple[str, ...]
    reasons: tuple[str, ...]
    penalty: float | None
    unguided: str
    chosen: str
    scores: tuple[float, ...] = ()  # the warned candidates' log-probabilities before the penalty (ranking)
    type: ClassVar[str] = "guidance"
    _NESTED: ClassVar[frozenset[str]] = frozenset({"warned", "reasons", "scores"})

    @classmethod
    def _nested(cls, name: str, value: Any) -> Any:
        if not isinstance(value, list):
            raise TraceFormatError(f"'guidance' event: {name} must be a list, got {value!r}")
        return tuple(float(v) for v in value) if name == "scores" else tuple(str(v) for v in value)

    @property
    def changed(self) -> bool:
        return self.unguided != self.chosen


@dataclass(frozen=True)
class RespondEvent(Event):
    """The agent gave a final response, which ends the episode."""

    text: str
    type: ClassVar[str] = "respond"


@dataclass(frozen=True)
class RollbackCallEvent(Event):
    """The agent called its `rollback` tool (optionally naming a checkpoint)."""

    reason: str
    target: int | None = None
    type: ClassVar[str] = "rollback_call"


@dataclass(frozen=True)
class ToolErrorEvent(Event):
    """A tool call the runtime refused; the message is what the agent was shown."""

    message: str
    type: ClassVar[str] = "tool_error"


# --- the controller's side: When, Where, What, and the restore ------------------------------------------
@dataclass(frozen=True)
class ReviewEvent(Event):
    """When: a review and its verdict. `raw` is the reply as given (the JSON text of the decision)."""

    trigger: str
    decision: str
    reason: str
    raw: str = ""
    # A ranked review's log p(recover) - log p(continue), kept so that a threshold can be refitted on
    # the agent's own online reviews; None where no model ranked (rules, free text, the terminal review).
    margin: float | None = None
    type: ClassVar[str] = "review"

    @property
    def recover(self) -> bool:
        return self.decision == "recover"


@dataclass(frozen=True)
class LocateEvent(Event):
    """Where: the coarse segments offered, the segment chosen and the restore point inside it."""

    segments: tuple[tuple[int, int], ...]
    segment: int
    step: int
    type: ClassVar[str] = "locate"
    _NESTED: ClassVar[frozenset[str]] = frozenset({"segments"})

    @classmethod
    def _nested(cls, name: str, value: Any) -> Any:
        try:
            return tuple((int(a), int(b)) for a, b in value)
        except (TypeError, ValueError):
            raise TraceFormatError(f"'locate' event: segments must be [start, end] pairs, got {value!r}") from None


@dataclass(frozen=True)
class LocateFailedEvent(Event):
    """Where found no checkpoint to restore (none admissible)."""

    error: str
    type: ClassVar[str] = "locate_failed"


@dataclass(frozen=True)
class LocateFallbackEvent(Event):
    """The controller named a checkpoint it may not use; the latest admissible one was taken."""

    asked: int
    type: ClassVar[str] = "locate_fallback"


@dataclass(frozen=True)
class ReflectEvent(Event):
    """What: the reflection kept for the restore to `restore_point`, and the memory after adding it."""

    restore_point: int
    reflection: Reflection
    memory: MemorySnapshot
    fallback: bool = False  # the controller's reply did not parse: the empty reflection was kept
    budget_spent: bool = False  # no model call was left for the What
    type: ClassVar[str] = "reflect"
    _NESTED: ClassVar[frozenset[str]] = frozenset({"reflection", "memory"})

    @classmethod
    def _nested(cls, name: str, value: Any) -> Any:
        if not isinstance(value, dict):
            raise TraceFormatError(f"'reflect' event: {name} must be an object, got {type(value).__name__}")
        try:
            return Reflection.from_json(value) if name == "reflection" else MemorySnapshot.from_json(value)
        except TypeError as err:
            raise TraceFormatError(f"'reflect' event: malformed {name} ({err})") from None


@dataclass(frozen=True)
class RestoreEvent(Event):
    """The world went back to checkpoint `to` (k steps; k = 0 keeps the state and only the memory)."""

    to: int
    k: int
    first_error: int | None = None  # the abandoned branch's first injected error, for evaluation
    type: ClassVar[str] = "restore"


@dataclass(frozen=True)
class RestoreFailedEvent(Event):
    """A restore the environment could not reproduce; the checkpoint is no longer admissible."""

    to: int
    error: str
    type: ClassVar[str] = "restore_failed"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        ResetEvent,
        StepEvent,
        GuidanceEvent,
        RespondEvent,
        RollbackCallEvent,
        ToolErrorEvent,
        ReviewEvent,
        LocateEvent,
        LocateFailedEvent,
        LocateFallbackEvent,
        ReflectEvent,
        RestoreEvent,
        RestoreFailedEvent,
    )
}


def event_from_json(data: Any) -> Event:
    """One event from its JSON object; `TraceFormatError` names what is wrong."""
    if not isinstance(data, dict):
        raise TraceFormatError(f"an event must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind not in EVENT_TYPES:
        raise TraceFormatError(f"unknown event type {kind!r}; known: {', '.join(EVENT_TYPES)}")
    return EVENT_TYPES[kind].from_json(data)


# --- plumbing -------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """JSON form of a field value: tuples become lists, nested records their own JSON."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)`, computed once per class: every event and record read needs them."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


_SCALARS = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def check_scalar(kind: str, name: str, value: Any, hints: dict[str, Any]) -> Any:
    """The value if it has the field's scalar type (`int | None` allows None); else an error."""
    allowed = [a for a in typing.get_args(hints[name])] or [hints[name]]
    if value is None and type(None) in allowed:
        return None
    for tp in allowed:
        ok = _SCALARS.get(tp)
        if ok and isinstance(value, ok) and not (tp is not bool and isinstance(value, bool)):
            return float(value) if tp is float else value
    expected = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
    raise TraceFormatError(f"'{kind}' event: field '{name}' must be {expected}, got {value!r}")
