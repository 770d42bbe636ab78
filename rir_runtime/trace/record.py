"""One episode's record and the append-only JSONL files that hold them.

Every line of an episodes file is one `EpisodeRecord`: the outcome and costs that reports sum,
and the typed event trace that labelling and analysis replay. Each line carries the schema
version it was written with; `read_records` refuses an unknown version and any malformed line,
naming the file and line, so a reader never guesses at a field's default. The only line it
forgives is a partial last one (a run killed mid-write): that episode is simply run again.

Schema history: 1 = the untyped event dicts of rir 0.1 (no version field); 2 = typed events and a
version on every line; 3 = the controller's model calls counted apart from the agent's
(`controller_calls`, its seconds and tokens, `charge_controller`). `rir trace upgrade <folder>`
converts version 1 files; version 2 lines are converted as they are read (`from_v2`), losslessly.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

from rir_runtime.envs.base import Split, TaskSpec
from rir_runtime.errors import UserInputError
from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace.events import Event, TraceFormatError, check_scalar, event_from_json, type_hints

TRACE_SCHEMA_VERSION = 3
READABLE_SCHEMAS = (2, 3)  # schema 2 lines are converted on reading


class TraceError(UserInputError):
    """An episodes file this version cannot read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode: what it was, how it ended, what it cost, and its event trace."""

    env: str
    task: str
    split: str
    variation: int
    method: str
    controller: str  # "-" for methods that never recover (react)
    policy: str
    success: bool
    score: float
    agent_calls: int  # the agent's own model calls
    controller_calls: int | None  # the controller's model calls; None: a schema-2 record that predates them
    rollbacks: int
    recoveries: int
    env_steps: int
    prompt_tokens: int  # of every model call, the agent's and the controller's
    completion_tokens: int
    wall_s: float
    parse_failures: int
    restore_divergences: int
    oracle_env_steps: int
    first_error_step: int | None
    stop_reason: str
    memory: MemorySnapshot
    events: tuple[Event, ...]
    # Set by the job that ran the episode (rir_runtime/orchestration/jobs.py).
    episode_id: str = ""
    seed: int = 0
    tag: str = ""
    error_rate: float = 0.0
    budget_agent: int = 0  # B_agent of this episode (a relative budget resolved against the expert's path)
    budget_rollback: int = 0
    budget_agent_spec: str = ""  # B_agent as asked: "60", or "1.5x" the expert's path length
    expert_steps: int | None = None  # the expert's path length at reset (measured for relative budgets)
    controller_decisions: int = 0  # every When, Where and What answered, rule or model
    controller_seconds: float = 0.0  # wall time of the controller's decisions
    controller_prompt_tokens: int = 0
    controller_completion_tokens: int = 0
    # Whether B_agent paid for the controller's calls too (every record before schema 3 did), and
    # B_ctrl, the controller's own bound (None: unbounded, or charged to B_agent).
    charge_controller: bool = False
    budget_controller: int | None = None

    @property
    def task_spec(self) -> TaskSpec:
        # `split` was a validated `TaskSpec.split` when the episode ran; the record stores it as plain text.
        return TaskSpec(self.env, self.task, cast(Split, self.split), self.variation)

    @property
    def method_key(self) -> str:
        """`<method>` for methods without a controller (react), else `<method>/<controller>`."""
        return self.method if self.controller == "-" else f"{self.method}/{self.controller}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": TRACE_SCHEMA_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "events":
                out["events"] = [e.to_json() for e in value]
            elif f.name == "memory":
                out["memory"] = value.to_json()
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRecord:
        """Build from one line's object (schema already checked); `TraceFormatError` on a bad field."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"schema"})
        if unknown:
            raise TraceFormatError(f"unknown field(s) {unknown}")
        missing = sorted(f.name for f in fields(cls) if f.name not in data and _required(f))
        if missing:
            raise TraceFormatError(f"record lacks field(s) {missing}")
        hints = type_hints(cls)
        values = {
            k: check_scalar("record", k, v, hints) for k, v in data.items() if k not in ("schema", "events", "memory")
        }
        if not isinstance(data["events"], list) or not isinstance(data["memory"], dict):
            raise TraceFormatError("'events' must be a list and 'memory' an object")
        values["events"] = tuple(_event(e, i) for i, e in enumerate(data["events"]))
        values["memory"] = MemorySnapshot.from_json(data["memory"])
        return cls(**values)

    def with_job(self, **job: Any) -> EpisodeRecord:
        """The record with the running job's identity filled in (episode id, seed, budgets, ...)."""
        return replace(self, **job)


def _required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _event(data: Any, i: int) -> Event:
    try:
        return event_from_json(data)
    except TraceFormatError as err:
        raise TraceFormatError(f"event {i}: {err}") from None


# --- files ------------------------------------------------------------------------------------------------
def parse_line(line: str, where: str) -> EpisodeRecord:
    """One JSONL line as a record; `TraceError` naming `where` (file:line) and the fix."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: not valid JSON ({err.msg}); the file is corrupt: restore or delete it") from None
    if not isinstance(data, dict):
        raise TraceError(f"{where}: a record must be a JSON object")
    schema = data.get("schema", 1)
    if schema == 2:
        data = from_v2(data)
    elif schema != TRACE_SCHEMA_VERSION:
        fix = (
            f"convert the run folder with `rir trace upgrade {Path(where.rsplit(':', 1)[0]).parent}`"
            if schema == 1
            else "read it with the rir version that wrote it"
        )
        raise TraceError(
            f"{where}: written with trace schema {schema}, this version reads {TRACE_SCHEMA_VERSION}: {fix}"
        )
    try:
        return EpisodeRecord.from_json(data)
    except TraceFormatError as err:
        raise TraceError(f"{where}: malformed record: {err}") from None


def from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-2 line as schema 3. Schema 2 charged every controller model call to B_agent and
    counted it in `agent_calls` (and apart in `controller_model_calls`, where known), and named the
    controller's decisions `controller_calls`; the conversion separates them and marks the record
    charged, so an old figure keeps its accounting visible."""
    out = {k: v for k, v in data.items() if k != "controller_model_calls"}
    model_calls = data.get("controller_model_calls")
    out["controller_decisions"] = data.get("controller_calls", 0)
    out["controller_calls"] = model_calls
    if isinstance(model_calls, int) and isinstance(data.get("agent_calls"), int):
        out["agent_calls"] = data["agent_calls"] - model_calls
    out["charge_controller"] = True
    out["schema"] = TRACE_SCHEMA_VERSION
    return out


def read_records(path: Path) -> list[EpisodeRecord]:
    """Every record of an episodes file (none when it does not exist)."""
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[EpisodeRecord]:
    """The file's records. Its last line may be torn by a kill (cut short, or overwritten by whatever the
    disk held): it is skipped with a warning and rerun; a bad line anywhere else is an error."""
    if not path.exists():
        return
    data = path.read_bytes()
    lines = [(n, raw) for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()]
    for i, (n, raw) in enumerate(lines):
        last = i == len(lines) - 1
        if last and not data.endswith(b"\n"):
            warnings.warn(f"{path}:{n}: ignoring a partial last line (a killed run); it will be rerun", stacklevel=2)
            return
        try:
            yield parse_line(raw.decode(), f"{path}:{n}")
        except (UnicodeDecodeError, TraceError) as err:
            if not last:
                if isinstance(err, UnicodeDecodeError):
                    raise TraceError(f"{path}:{n}: not UTF-8 text; the file is corrupt: restore or delete it") from None
                raise
            warnings.warn(f"{path}:{n}: ignoring a torn last line (a killed run); it will be rerun", stacklevel=2)


def drop_partial_tail(path: Path) -> None:
    """Cut a torn last line (a run killed mid-write: cut short, or not a record) so the next record
    starts on a fresh line."""
    if not path.exists() or not path.stat().st_size:
        return
    data = path.read_bytes()
    kept = data[: data.rfind(b"\n") + 1]  # a line without its newline was cut short
    body = kept.rstrip(b"\n")
    start = body.rfind(b"\n") + 1
    if body[start:].strip() and not _is_json_object(body[start:]):
        kept = kept[:start]
    if kept != data:
        path.write_bytes(kept)


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw.decode()), dict)
    except (UnicodeDecodeError, ValueError):
        return False


def append_record(fh: Any, record: EpisodeRecord) -> None:
    """One line per finished episode, flushed at once: a kill loses at most the episodes in flight. An
    unbuffered binary handle (`open(path, "ab", buffering=0)`) keeps nothing back that a full disk could
    fail again on closing."""
    line = json.dumps(record.to_json()) + "\n"
    if "b" in getattr(fh, "mode", ""):
        data = memoryview(line.encode())
        while data:  # an unbuffered write may stop short at a size limit; the next one raises
            data = data[fh.write(data) :]
        return
    fh.write(line)
    fh.flush()
