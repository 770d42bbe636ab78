"""`stock-transfer`: a warehouse stops carrying a category; its units move and low stock is reordered.

The agent finds the two warehouses by name and the category's products, reads each product's
stock, moves everything from the closing warehouse, and then orders whole cases for the products
still below their threshold at the receiving one. The reorder quantity depends on the stock
*after* the transfer, so a reorder computed from the first reading is a plausible silent mistake.
"""

from __future__ import annotations

import math

from rir_runtime.envs.shopdb.generate import CATALOGUE, ShopBuilder
from rir_runtime.envs.shopdb.tasks.plan import TaskPlan, variants
from rir_runtime.envs.shopdb.tools import op


def cases_for(short: int, case: int) -> int:
    """Units in the fewest whole cases that cover `short` missing units."""
    return case * math.ceil(short / case)


def build(shop: ShopBuilder) -> TaskPlan:
    rng, conn = shop.rng, shop.conn
    category = rng.choice(sorted(CATALOGUE))
    products = shop.ids("SELECT product_id FROM products WHERE category = ? ORDER BY product_id", category)
    others = shop.ids("SELECT product_id FROM products WHERE category <> ? ORDER BY product_id", category)
    warehouses = shop.warehouses()
    source, target = rng.sample(warehouses, 2)
    third = next(w for w in warehouses if w not in (source, target))
    names = dict(conn.execute("SELECT warehouse_id, name FROM warehouses").fetchall())

    at_source = {p: 0 if rng.random() < 0.2 else rng.randint(1, 30) for p in products}
    for p in rng.sample(products, 2):
        at_source[p] = at_source[p] or rng.randint(1, 30)  # at least two products really move
    at_target = {p: rng.randint(0, 25) for p in products}
    for p in products:
        shop.set_stock(p, source, at_source[p])
        shop.set_stock(p, target, at_target[p])

    reads = (op("list_warehouses"), op("find_product", category))
    wrong: dict[str, tuple[str, ...]] = {
        reads[1]: (op("find_product", rng.choice(sorted(set(CATALOGUE) - {category}))),)
    }
    steps: list[str] = list(reads)
    for p in products:
        threshold, case = conn.execute(
            "SELECT reorder_threshold, case_size FROM products WHERE product_id = ?", (p,)
        ).fetchone()
        look = op("get_stock", p)
        steps.append(look)
        wrong[look] = (op("get_stock", rng.choice(others)),)
        moved = at_source[p]
        if moved:
            move = op("transfer", p, source, target, moved)
            steps.append(move)
            wrong[move] = variants(
                move,
                op("transfer", p, source, target, moved - 1) if moved > 1 else None,
                op("transfer", p, source, target, moved + 1),  # more than there is: refused
                op("transfer", p, source, third, moved),
                op("transfer", p, target, source, moved),
            )
        after = at_target[p] + moved
        if after < threshold:
            qty = cases_for(threshold - after, case)
            order = op("reorder", p, target, qty)
            steps.append(order)
            before = cases_for(threshold - at_target[p], case)  # from the reading before the move
            wrong[order] = variants(
                order,
                op("reorder", p, target, before),
                op("reorder", p, source, qty),
                op("reorder", p, target, qty + case),
                op("reorder", p, target, qty + 1),  # not whole cases: refused
            )

    objective = (
        f"Warehouse {names[source]} stops carrying {category} products. Move every unit of every {category} "
        f"product it holds to warehouse {names[target]} (transfer). Then, for each {category} product whose stock "
        f"at {names[target]} after the move is below its reorder threshold, order whole cases for "
        f"{names[target]} (reorder): qty = case size x ceil((threshold - stock at {names[target]}) / case size). "
        "Products at or above the threshold get no order. Then finish."
    )
    distractors = tuple(w for r in steps if r.startswith(("find_product", "get_stock")) for w in wrong[r])
    return TaskPlan(objective, tuple(steps), wrong, distractors)
