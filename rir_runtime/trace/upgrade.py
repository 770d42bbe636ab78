"""`rir trace upgrade <folder>`: convert episodes files of trace schemas 1 and 2 to the current schema.

Schema 1 (rir 0.1) wrote the same records without a version and with untyped events, whose
optional fields were sometimes left out. The conversion is mechanical and lossless: it writes each
optional field with the default its readers assumed, renames a `locate` event that carried an
`error` to `locate_failed`, validates every record with the current reader, and keeps the original
file as `<name>.v1.bak`. Schema 2 lines (read as they are without upgrading, `record.from_v2`) are
converted the same way: the controller's model calls are taken out of `agent_calls`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rir_runtime.errors import UserInputError
from rir_runtime.trace.record import TRACE_SCHEMA_VERSION, EpisodeRecord, from_v2

# What schema-1 readers assumed when a field was absent.
V1_RECORD_DEFAULTS: dict[str, Any] = {
    "controller_calls": 0,
    "recoveries": 0,
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "parse_failures": 0,
    "restore_divergences": 0,
    "oracle_env_steps": 0,
    "first_error_step": None,
    "stop_reason": "",
    "memory": {},
    "tag": "",
}


def upgrade_record(data: dict[str, Any]) -> dict[str, Any]:
    """One schema-1 record as a current one (validated: raises `TraceFormatError` if it cannot be)."""
    events = []
    for event in data.get("events", []):
        if event.get("type") == "locate" and "error" in event:
            event = {"type": "locate_failed", "t": event["t"], "error": event["error"]}
        events.append(event)
    if data.get("schema", 1) == 1:
        data = {**V1_RECORD_DEFAULTS, **data, "events": events}
    out = from_v2(data)  # schema 1 and 2 charged the controller's calls to B_agent alike
    out.pop("schema", None)
    EpisodeRecord.from_json(out)  # the current reader must accept it
    return {"schema": TRACE_SCHEMA_VERSION, **out}


def upgrade_file(path: Path) -> int:
    """Rewrite one episodes file in place (original kept as .v1.bak); returns the records converted."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records, converted = [], 0
    for n, line in enumerate(lines, start=1):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # a partial last line of a killed run: that episode will be rerun
                continue
            raise UserInputError(f"{path}:{n}: not valid JSON; fix or delete the line, then upgrade again") from None
        if data.get("schema", 1) == TRACE_SCHEMA_VERSION:
            records.append(data)
            continue
        try:
            records.append(upgrade_record(data))
        except (ValueError, TypeError, KeyError) as err:
            raise UserInputError(f"{path}:{n}: cannot convert this record ({err})") from None
        converted += 1
    if not converted:
        return 0
    backup = path.with_name(path.name + ".v1.bak")
    path.rename(backup)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records)


def upgrade_run(folder: Path) -> dict[str, int]:
    """Every episodes file of a run folder (eval or rollout), and a rollout's run.json."""
    paths = sorted(folder.glob("episodes*.jsonl"))
    if not paths:
        raise UserInputError(f"{folder} holds no episodes*.jsonl: pass a folder written by rir eval or rir rollout")
    counts = {str(p): upgrade_file(p) for p in paths}
    run = folder / "run.json"
    if run.exists():
        meta = json.loads(run.read_text())
        meta["schema"] = TRACE_SCHEMA_VERSION
        run.write_text(json.dumps(meta, indent=2) + "\n")
    for path, n in counts.items():
        print(f"{path}: {n} records now schema {TRACE_SCHEMA_VERSION} (original kept as .v1.bak)", file=sys.stderr)
    return counts
