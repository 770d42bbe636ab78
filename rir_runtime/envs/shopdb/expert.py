"""The expert: the plan from any state, recomputed against the gold database.

What remains is worked out per kind of tool:
- `append` writes and external calls cannot be taken back, so the gold ones not yet made remain
  (a multiset difference: the same call twice counts twice);
- `set` writes are read off the database: every overwritable field whose value differs from the
  gold one needs its `set` call, which also corrects a wrong earlier `set` (no restore needed).
The remaining writes are then run on a scratch copy of the database; when the copy does not end
equal to the gold database (a wrong append: a refund too many, points taken from the wrong
account) or an external call the gold plan does not make was sent, no plan exists: [] (the
branch is doomed, as the built-in workshop's is after a silent error). Reads are added back where
a remaining write follows them in the gold plan and this branch has not made them.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable

from rir_runtime.envs.shopdb import schema
from rir_runtime.envs.shopdb.grading import content_hash
from rir_runtime.envs.shopdb.readonly import SCHEMA_QUERY
from rir_runtime.envs.shopdb.scenario import Scenario, settable
from rir_runtime.envs.shopdb.tools import Call, kind_of, parse
from rir_runtime.envs.shopdb.writes import Refused, apply_write

FINISH = "finish"


def _unmade(gold: Iterable[tuple[int, str]], made: Iterable[str]) -> list[tuple[int, str]]:
    left = Counter(made)
    out = []
    for i, step in gold:
        if left[step] > 0:
            left[step] -= 1
        else:
            out.append((i, step))
    return out


def remaining_writes(sc: Scenario, conn: sqlite3.Connection, made: tuple[str, ...]) -> list[tuple[int, str]] | None:
    """(gold index, call) of the writes and external calls still to make, in order; None when the
    gold state is out of reach from here. `made` lists the successful writes and calls so far."""
    if Counter(m for m in made if kind_of(m) == "external") - Counter(sc.gold_outbox):
        return None  # an external call the policy does not ask for: it cannot be taken back
    gold = [(i, s) for i, s in enumerate(sc.steps) if kind_of(s) in ("append", "external")]
    todo = _unmade(gold, made)
    index = {s: i for i, s in enumerate(sc.steps)}
    now = settable(conn)
    todo += [(index.get(call, -1), call) for key, call in sc.gold_settable.items() if now.get(key) != call]
    todo.sort(key=lambda pair: pair[0])
    scratch = schema.copy_of(conn.serialize())
    try:
        for _, step in todo:
            call = parse(step)
            if isinstance(call, Call) and call.kind not in ("external", "read"):
                apply_write(scratch, call)
        return todo if content_hash(scratch) == sc.gold_hash else None
    except Refused:
        return None
    finally:
        scratch.close()


def with_reads(sc: Scenario, todo: list[tuple[int, str]], seen: Iterable[str]) -> list[str]:
    """The remaining writes with the gold reads that precede one of them and were not made yet."""
    made = {s.casefold() for s in seen}
    last = max((i for i, _ in todo), default=-1)
    reads = [(i, s) for i, s in enumerate(sc.steps) if kind_of(s) == "read" and i < last and s.casefold() not in made]
    return [s for _, s in sorted(todo + reads, key=lambda pair: pair[0])] + [FINISH]


def pending(sc: Scenario, made: tuple[str, ...], seen: Iterable[str]) -> list[str]:
    """The gold steps not made yet, whether or not they can still succeed: what an agent that has
    not noticed a silent mistake would still do (the valid actions keep offering them)."""
    ops = _unmade([(i, s) for i, s in enumerate(sc.steps) if kind_of(s) != "read"], made)
    made_reads = {s.casefold() for s in seen}
    reads = [(i, s) for i, s in enumerate(sc.steps) if kind_of(s) == "read" and s.casefold() not in made_reads]
    return [s for _, s in sorted(ops + reads, key=lambda pair: pair[0])] + [FINISH]


MAX_ACTIONS = 39


def admissible(sc: Scenario, upcoming: list[str]) -> list[str]:
    """The calls that make sense now: the task's reads and their look-alikes, the next steps of the
    plan, and the plausible wrong versions of the next one (sorted, fewer than 40)."""
    nexts = [a for a in upcoming if a != FINISH][:3]
    actions = {FINISH, "list_warehouses", SCHEMA_QUERY, *sc.reads, *sc.distractors, *nexts}
    if nexts:
        actions.update(sc.wrong.get(nexts[0], ()))
    ordered = sorted(actions)
    if len(ordered) > MAX_ACTIONS:  # never drop the plan's next step
        keep = set(nexts[:1]) | {FINISH}
        ordered = sorted(keep | set([a for a in ordered if a not in keep][: MAX_ACTIONS - len(keep)]))
    return ordered
