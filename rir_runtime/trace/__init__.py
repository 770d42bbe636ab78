"""The episode trace: typed events, the record of one episode, its files, and one replay.

from rir_runtime.trace import read_records, replay
for record in read_records(Path("runs/eval/presets-builtin/episodes.jsonl")):
    for point in replay(record).reviews:
        print(point.review.decision, len(point.steps))
"""

from rir_runtime.trace.events import (
    EVENT_TYPES,
    Event,
    GuidanceEvent,
    LocateEvent,
    LocateFailedEvent,
    LocateFallbackEvent,
    ReflectEvent,
    ResetEvent,
    RespondEvent,
    RestoreEvent,
    RestoreFailedEvent,
    ReviewEvent,
    RollbackCallEvent,
    StepEvent,
    ToolErrorEvent,
    TraceFormatError,
)
from rir_runtime.trace.record import (
    READABLE_SCHEMAS,
    TRACE_SCHEMA_VERSION,
    EpisodeRecord,
    TraceError,
    append_record,
    drop_partial_tail,
    iter_records,
    parse_line,
    read_records,
)
from rir_runtime.trace.replay import Branch, Replay, ReviewPoint, replay

__all__ = [
    "EVENT_TYPES",
    "READABLE_SCHEMAS",
    "TRACE_SCHEMA_VERSION",
    "Branch",
    "EpisodeRecord",
    "Event",
    "GuidanceEvent",
    "LocateEvent",
    "LocateFailedEvent",
    "LocateFallbackEvent",
    "ReflectEvent",
    "Replay",
    "ResetEvent",
    "RespondEvent",
    "RestoreEvent",
    "RestoreFailedEvent",
    "ReviewEvent",
    "ReviewPoint",
    "RollbackCallEvent",
    "StepEvent",
    "ToolErrorEvent",
    "TraceError",
    "TraceFormatError",
    "append_record",
    "drop_partial_tail",
    "iter_records",
    "parse_line",
    "read_records",
    "replay",
]
