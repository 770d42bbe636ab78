"""One variation, fully worked out: the initial database, the gold database and the gold plan.

The gold database is made by running the gold plan through the same write tools the agent uses,
so a plan the shop's rules refuse fails here, at generation, not in an episode. Scenarios are
cached per `TaskSpec`: a reset only deserializes bytes.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from rir_runtime.envs.base import TaskSpec
from rir_runtime.envs.shopdb import schema
from rir_runtime.envs.shopdb.generate import build_shop
from rir_runtime.envs.shopdb.grading import Rows, content_hash, read_rows
from rir_runtime.envs.shopdb.tasks import TASKS
from rir_runtime.envs.shopdb.tools import Call, op, parse
from rir_runtime.envs.shopdb.writes import Refused, apply_write

SPLIT_SEED_BASE = {"train": 0, "dev": 100_000, "test": 200_000}
VARIATIONS_PER_SPLIT = 10_000

#: the fields a `set` tool overwrites: tool -> SQL listing (id, value) for every row
SETTABLE = {
    "set_price": "SELECT product_id, price_cents FROM products",
    "set_line_price": "SELECT line_id, unit_cents FROM order_lines",
    "reassign_order": "SELECT order_id, customer_id FROM orders",
    "set_tier": "SELECT customer_id, tier FROM customers",
}


def settable(conn: sqlite3.Connection) -> dict[tuple[str, int], str]:
    """Every overwritable field as the `set` call that would write its current value."""
    return {
        (tool, int(key)): op(tool, key, value) for tool, sql in SETTABLE.items() for key, value in conn.execute(sql)
    }


def seed(task: TaskSpec) -> str:
    return f"shopdb/{task.task}/{SPLIT_SEED_BASE[task.split] + task.variation}"


@dataclass(frozen=True)
class Scenario:
    task: TaskSpec
    objective: str
    init_db: bytes
    steps: tuple[str, ...]  # gold reads, writes and external calls (canonical), without `finish`
    wrong: Mapping[str, tuple[str, ...]]
    distractors: tuple[str, ...]
    gold_hash: str
    gold_outbox: tuple[str, ...]
    gold_settable: Mapping[tuple[str, int], str]
    init_rows: Rows
    gold_rows: Rows

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(s for s in self.steps if _kind(s) == "read")

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(s for s in self.steps if _kind(s) != "read")


def _kind(action: str) -> str:
    call = parse(action)
    assert isinstance(call, Call), action
    return call.kind


@lru_cache(maxsize=64)
def scenario(task: TaskSpec) -> Scenario:
    """The worked-out variation `task` (deterministic in the task name, split and variation)."""
    shop = build_shop(random.Random(seed(task)))
    plan = TASKS[task.task](shop)
    init = shop.conn.serialize()
    shop.conn.close()
    gold, start = schema.copy_of(init), schema.copy_of(init)
    outbox = []
    for step in plan.steps:
        call = parse(step)
        assert isinstance(call, Call) and call.canonical == step, f"gold step '{step}' is not canonical"
        if call.kind == "external":
            outbox.append(step)
        elif call.kind not in ("read", "finish"):
            try:
                apply_write(gold, call)
            except Refused as err:
                raise RuntimeError(f"{task.key}: the gold plan breaks a shop rule at '{step}': {err}") from None
    try:
        return Scenario(
            task=task,
            objective=plan.objective,
            init_db=init,
            steps=plan.steps,
            wrong=plan.wrong,
            distractors=plan.distractors,
            gold_hash=content_hash(gold),
            gold_outbox=tuple(outbox),
            gold_settable=settable(gold),
            init_rows=read_rows(start),
            gold_rows=read_rows(gold),
        )
    finally:
        gold.close()
        start.close()
