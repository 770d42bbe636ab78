"""Grading: the database against the gold database, as tau2-bench does, plus the outbox.

Success is an exact match: the hash of the sorted rows of every table equals the gold one, and
the outbox holds exactly the gold external calls. The score is the share of required changes
matched: a required change is a row the gold database changed (by key in entity tables, by content
in ledgers) or a gold external call; a wrong change (a row changed in a way the gold did not, a
call the gold did not make) counts against it, so only an exact match scores 1.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from rir_runtime.envs.shopdb.schema import KEY_COLUMNS, LEDGERS, TABLES

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
class Tally:
    """Required changes, how many the current state matches, and how many wrong changes it made."""

    required: int
    matched: int
    wrong: int

    @property
    def share(self) -> float:
        return self.matched / max(1, self.required + self.wrong)


def _multiset(init: Counter[Row] | Counter[str], gold: Iterable, now: Iterable) -> tuple[int, int, int]:
    need = Counter(gold) - init
    have = Counter(now) - init
    return sum(need.values()), sum((need & have).values()), sum((have - need).values())


def tally(init: Rows, gold: Rows, now: Rows, gold_outbox: Iterable[str], outbox: Iterable[str]) -> Tally:
    required = matched = wrong = 0
    for table, keyed in gold.entities.items():
        before, after = init.entities[table], now.entities[table]
        for key in set(before) | set(keyed) | set(after):
            g, b, a = keyed.get(key), before.get(key), after.get(key)
            required += g != b
            matched += g != b and a == g
            wrong += a != g and a != b
    for table, counted in gold.ledgers.items():
        r, m, w = _multiset(init.ledgers[table], counted.elements(), now.ledgers[table].elements())
        required, matched, wrong = required + r, matched + m, wrong + w
    r, m, w = _multiset(Counter(), gold_outbox, outbox)
    return Tally(required + r, matched + m, wrong + w)
