"""The `query` tool: one SQL SELECT, read-only by SQLite's own authorizer.

The authorizer is asked about every operation while SQLite compiles a statement; it allows reading
and nothing else, so INSERT/UPDATE/DELETE/DROP, a write behind a CTE (`WITH x AS (...) DELETE ...`),
ATTACH, transactions and setting pragmas are refused before anything runs. No string matching is
involved: SQLite parses the statement, so comments, odd spacing or case cannot smuggle a write.
A progress handler stops runaway queries (a recursive CTE without end).
"""

from __future__ import annotations

import sqlite3
from typing import Any

ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
#: pragmas that only describe the schema (their argument names a table or index); every other is refused
DESCRIBING_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}
MAX_ROWS = 30
MAX_OPCODES = 2_000_000  # SQLite virtual-machine steps one query may take
SCHEMA_QUERY = "query SELECT name, sql FROM sqlite_master WHERE type = 'table'"
REFUSED = "query refused: read-only tool, it cannot change the database; use the write tools"


class _Guard:
    """Authorizer and progress handler for one query; remembers whether it denied something."""

    def __init__(self) -> None:
        self.denied = False
        self.ticks = 0

    def authorize(self, code: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
        if code in ALLOWED or (code == sqlite3.SQLITE_PRAGMA and arg1 in DESCRIBING_PRAGMAS):
            return sqlite3.SQLITE_OK
        self.denied = True
        return sqlite3.SQLITE_DENY

    def progress(self) -> int:
        self.ticks += 1
        return int(self.ticks * 1000 > MAX_OPCODES)


def statements(sql: str) -> list[str]:
    """`sql` cut into complete statements (SQLite decides where one ends: a `;` inside a string
    literal does not end it)."""
    found, buffer = [], ""
    for piece in sql.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\r\n;"):
                found.append(buffer)
            buffer = ""
    if buffer.strip(" \t\r\n;"):
        found.append(buffer)
    return found


def _run(conn: sqlite3.Connection, sql: str, guard: _Guard) -> tuple[list[str], list[tuple[Any, ...]], bool] | str:
    """Columns, the first rows and whether more exist; or the refusal text."""
    conn.set_authorizer(guard.authorize)
    conn.set_progress_handler(guard.progress, 1000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(MAX_ROWS + 1)
        columns = [d[0] for d in cursor.description or ()]
        cursor.close()
    except sqlite3.Error as err:
        if guard.denied:
            return REFUSED
        if isinstance(err, sqlite3.OperationalError) and str(err) == "interrupted":
            return "query refused: it ran too long and cannot finish; narrow it down"
        return f"query failed: {err}. The SQL cannot run; see the schema with: {SCHEMA_QUERY}"
    finally:
        conn.set_authorizer(None)
        conn.set_progress_handler(None, 1000)
    return columns, rows[:MAX_ROWS], len(rows) > MAX_ROWS


def _table(columns: list[str], rows: list[tuple[Any, ...]], more: bool) -> str:
    if not columns:
        return "query returned no columns"
    lines = [" | ".join(columns)]
    lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows]
    footer = f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', more not shown' if more else ''})"
    return "\n".join([*lines, footer])


def run_query(conn: sqlite3.Connection, sql: str) -> str:
    """The observation of `query <sql>`: a small text table, or a clear refusal/failure."""
    parts = statements(sql)
    if not parts:
        return "query failed: no SQL given; the call cannot run"
    results = [_run(conn, part, _Guard()) for part in parts]  # every part meets the authorizer
    refused = [r for r in results if isinstance(r, str)]
    if refused:
        return REFUSED if REFUSED in refused else refused[0]
    if len(parts) > 1:
        return "query refused: one SQL statement per call; it cannot run several"
    first = results[0]
    assert not isinstance(first, str)
    return _table(*first)
