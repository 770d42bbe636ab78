"""A database env's step on the page: the SQL of a `query` call and the rows a write changed.

The rows come from the step event (`StepEvent.changes`, what the env reported); the SQL is read off the
action with the env's own parser, so the page shows what the tool ran. Like the rest of `data`, these are
plain texts the script sets as text: a value from the database (a product named `<script>`) stays text.
"""

from __future__ import annotations

from typing import Any

from rir_runtime.envs.base import RowChange
from rir_runtime.envs.shopdb.tools import Call, parse
from rir_runtime.trace import Event, StepEvent


def step_fields(env: str, event: Event) -> dict[str, Any]:
    """What a step adds to the page beyond its action and observation: its SQL, its changed rows."""
    if not isinstance(event, StepEvent):
        return {}
    out: dict[str, Any] = {}
    sql = query_sql(env, event.action)
    if sql is not None:
        out["sql"] = sql
    if event.changes:
        out["changes"] = [change_text(c) for c in event.changes]
    return out


def query_sql(env: str, action: str) -> str | None:
    """The SQL of a shopdb `query` call, as the tool ran it (read by shopdb's parser); None otherwise."""
    if env != "shopdb":
        return None
    call = parse(action)
    return str(call.values[0]) if isinstance(call, Call) and call.name == "query" else None


def change_text(change: RowChange) -> str:
    """One changed row as a line: `order_lines line_id=78: returned_qty 0 → 1`, or the row inserted or deleted."""
    where = f"{change.table} {change.key}" if change.key else change.table
    if change.op == "update":
        return f"{where}: " + ", ".join(f"{c.column} {c.before} → {c.after}" for c in change.columns)
    inserted = change.op == "insert"  # the row as it is after an insert, as it was before a delete
    cells = ", ".join(f"{c.column}={c.after if inserted else c.before}" for c in change.columns)
    return f"{where}: {'inserted' if inserted else 'deleted'} {cells}"
