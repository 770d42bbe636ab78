"""Grading: the database against the gold database, as tau2-bench does, plus the outbox.

Success is an exact match: the hash of the sorted rows of every table equals the gold one, and
the outbox holds exactly the gold external calls. The score is the share of required changes
matched: a required change is a row the gold database changed (by key in entity tables, by content
in ledgers) or a gold external call; a wrong change (a row changed in a way the gold did not, a
call the gold did not make) counts against it, so only an exact match scores 1.

Both compare diffs (`diff`): the gold's from the initial database with the branch's. The same diff
of one step's database before and after it is what the trace shows for that step (`changes`).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rir_runtime.envs.base import ColumnChange, RowChange
from rir_runtime.envs.shopdb.schema import KEY_COLUMNS, LEDGERS, TABLES, columns

Row = tuple[object, ...]


@dataclass(frozen=True)
class Rows:
    """Every table's rows: entity tables by key, ledgers as multisets without surrogate ids."""

    entities: dict[str, dict[Row, Row]]
    ledgers: dict[str, Counter[Row]]


def table_rows(conn: sqlite3.Connection, table: str) -> list[Row]:
    rows = [tuple(r) for r in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608 - table names are ours
    return sorted(r[1:] for r in rows) if table in LEDGERS else sorted(rows)


def read_rows(conn: sqlite3.Connection) -> Rows:
    entities: dict[str, dict[Row, Row]] = {}
    ledgers: dict[str, Counter[Row]] = {}
    for table in TABLES:
        rows = table_rows(conn, table)
        if table in LEDGERS:
            ledgers[table] = Counter(rows)
        else:
            n = KEY_COLUMNS[table]
            entities[table] = {r[:n]: r for r in rows}
    return Rows(entities, ledgers)


def content_hash(conn: sqlite3.Connection) -> str:
    """sha256 of every table's sorted rows (ledgers without ids): equal content, equal hash."""
    digest = hashlib.sha256()
    for table in TABLES:
        digest.update(f"{table}:{table_rows(conn, table)!r}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Diff:
    """What changed from one `Rows` to another: the entity rows by key, as (before, after) with None for
    a row that is not there, and the ledger rows added and removed. Grading compares the gold's diff from
    the initial database with the branch's; a step's diff is what the trace shows for it."""

    entities: dict[str, dict[Row, tuple[Row | None, Row | None]]]
    added: dict[str, Counter[Row]]
    removed: dict[str, Counter[Row]]


def diff(before: Rows, after: Rows) -> Diff:
    """The one diff of two states: grading and a step's changed rows both read it."""
    entities = {}
    for table, now in after.entities.items():
        was = before.entities[table]
        entities[table] = {k: (was.get(k), now.get(k)) for k in was.keys() | now.keys() if was.get(k) != now.get(k)}
    added = {t: after.ledgers[t] - before.ledgers[t] for t in after.ledgers}
    removed = {t: before.ledgers[t] - after.ledgers[t] for t in after.ledgers}
    return Diff(entities, added, removed)


@dataclass(frozen=True)
class Tally:
    """Required changes, how many the current state matches, and how many wrong changes it made."""

    required: int
    matched: int
    wrong: int

    @property
    def share(self) -> float:
        return self.matched / max(1, self.required + self.wrong)

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.required + other.required, self.matched + other.matched, self.wrong + other.wrong)


def _keyed(need: dict[Row, tuple[Row | None, Row | None]], made: dict[Row, tuple[Row | None, Row | None]]) -> Tally:
    """Entity rows: a required row matches when the branch changed it as the gold did (both diffs start
    from the same row); a row the branch changed otherwise is wrong."""
    return Tally(len(need), sum(made.get(k) == change for k, change in need.items()),
                 sum(change != need.get(k) for k, change in made.items()))  # fmt: skip


def _counted(need: Counter[Any], made: Counter[Any]) -> Tally:
    """Appended rows and external calls, as multisets: the ones the gold added, those also made, and the extra."""
    return Tally(sum(need.values()), sum((need & made).values()), sum((made - need).values()))


def tally(init: Rows, gold: Rows, now: Rows, gold_outbox: Iterable[str], outbox: Iterable[str]) -> Tally:
    need, made = diff(init, gold), diff(init, now)
    parts = [_keyed(rows, made.entities[table]) for table, rows in need.entities.items()]
    parts += [_counted(rows, made.added[table]) for table, rows in need.added.items()]
    parts.append(_counted(Counter(gold_outbox), Counter(outbox)))
    return sum(parts, Tally(0, 0, 0))


def changes(before: Rows, after: Rows) -> tuple[RowChange, ...]:
    """The rows that changed from `before` to `after`, named and in text, in table order: what a step did."""
    d = diff(before, after)
    out: list[RowChange] = []
    for table in TABLES:
        names = columns(table)
        if table in LEDGERS:
            names = names[1:]  # ledger rows are compared without their surrogate id
            out += [_row(table, "", "insert", names, None, r) for r in sorted(d.added[table].elements())]
            out += [_row(table, "", "delete", names, r, None) for r in sorted(d.removed[table].elements())]
            continue
        n = KEY_COLUMNS[table]
        for key, (was, now) in sorted(d.entities[table].items()):
            op = "insert" if was is None else "delete" if now is None else "update"
            out.append(_row(table, _named(names[:n], key), op, names, was, now))
    return tuple(out)


def _row(table: str, key: str, op: str, names: tuple[str, ...], was: Row | None, now: Row | None) -> RowChange:
    """One changed row; an update lists only its changed columns."""
    cells = [
        ColumnChange(name, None if was is None else _text(was[i]), None if now is None else _text(now[i]))
        for i, name in enumerate(names)
    ]
    return RowChange(table, key, op, tuple(c for c in cells if op != "update" or c.before != c.after))


def _named(names: tuple[str, ...], key: Row) -> str:
    return ", ".join(f"{name}={_text(value)}" for name, value in zip(names, key, strict=True))


def _text(value: object) -> str:
    return "NULL" if value is None else str(value)
