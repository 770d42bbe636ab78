"""`merge-accounts`: a customer registered twice; the newer account is merged into the older one.

The agent finds both accounts (same name, the objective gives both emails in random order) and
decides which is older by its creation date, notifies the account being closed, moves its
orders except cancelled ones, moves its points, closes it, and upgrades the kept account when
the merged points reach the gold threshold. The database refuses to close an account that still
holds open orders or points, and to move orders to a closed account.
"""

from __future__ import annotations

from datetime import date, timedelta

from rir_runtime.envs.shopdb.generate import ShopBuilder
from rir_runtime.envs.shopdb.tasks.plan import TaskPlan, variants
from rir_runtime.envs.shopdb.tools import op

GOLD_POINTS = 1000

POLICY = f"""Policy:
1. Keep the account created first; the other one is closed. Before any database change, email the account being
   closed the template merge_notice.
2. Move every order of the closed account to the kept account (reassign_order), except cancelled orders, which stay.
3. Move all loyalty points of the closed account: adjust_points <closed> -<points>, then
   adjust_points <kept> <points>.
4. Close the account (deactivate_customer).
5. If the kept account is not gold and now has {GOLD_POINTS} points or more, set its tier to gold.
Then finish."""


def build(shop: ShopBuilder) -> TaskPlan:
    rng, conn = shop.rng, shop.conn
    name = shop.fresh_name()
    moved_points = rng.randint(20, 700)
    if rng.random() < 0.5:
        kept_points = rng.randint(GOLD_POINTS - moved_points, GOLD_POINTS - moved_points + 300)
    else:
        kept_points = rng.randint(0, GOLD_POINTS - moved_points - 1)
    kept_tier = "gold" if rng.random() < 0.3 else "standard"
    old_created = date(2019, 1, 1) + timedelta(days=rng.randint(0, 1200))
    new_created = date(2023, 1, 1) + timedelta(days=rng.randint(0, 500))
    kept = shop.add_customer(name, tier=kept_tier, points=kept_points, created=old_created)
    closed = shop.add_customer(name, tier="standard", points=moved_points, created=new_created)
    twin = shop.with_twin(kept)
    products = shop.ids("SELECT product_id FROM products")

    def orders_for(customer: int, statuses: list[str]) -> list[int]:
        lines = [[shop.line_of(p) for p in rng.sample(products, rng.randint(1, 2))] for _ in statuses]
        return [shop.add_order(customer, s, shop.placed_date(), ls)[0] for s, ls in zip(statuses, lines, strict=True)]

    orders_for(kept, rng.choices(("paid", "shipped", "delivered"), k=rng.randint(1, 2)))
    moving = orders_for(closed, rng.choices(("pending", "paid", "shipped", "delivered"), k=rng.randint(1, 5)))
    staying = orders_for(closed, ["cancelled"] * rng.randint(0, 1))
    orders_for(twin, ["delivered"])

    reads = (op("lookup_customer", name), op("list_orders", closed))
    email = op("send_email", closed, "merge_notice")
    moves = [op("reassign_order", o, kept) for o in moving]
    take = op("adjust_points", closed, -moved_points)
    give = op("adjust_points", kept, moved_points)
    close = op("deactivate_customer", closed)
    upgrade = kept_tier == "standard" and kept_points + moved_points >= GOLD_POINTS
    tier = op("set_tier", kept, "gold")

    wrong: dict[str, tuple[str, ...]] = {
        reads[0]: (op("lookup_customer", shop.name_of(twin)),),
        reads[1]: (op("list_orders", kept), op("list_orders", twin)),
        email: variants(email, op("send_email", kept, "merge_notice"), op("send_email", closed, "accounts_merged")),
        take: variants(
            take, op("adjust_points", closed, -(moved_points - 1)), op("adjust_points", kept, -moved_points)
        ),
        give: variants(give, op("adjust_points", twin, moved_points), op("adjust_points", kept, moved_points + 1)),
        close: (op("deactivate_customer", kept),),  # refused: the kept account holds orders
        tier: (op("set_tier", closed, "gold"),),
    }
    for o, move in zip(moving, moves, strict=True):
        wrong[move] = variants(
            move,
            op("reassign_order", o, twin),
            op("reassign_order", staying[0], kept) if staying else None,  # a cancelled order moved
        )

    emails = [e for (e,) in conn.execute("SELECT email FROM customers WHERE customer_id IN (?, ?)", (kept, closed))]
    rng.shuffle(emails)
    objective = f"{name} registered twice, as {emails[0]} and {emails[1]}. Merge the two accounts.\n{POLICY}"
    steps = (*reads, email, *moves, take, give, close, *([tier] if upgrade else []))
    return TaskPlan(objective, steps, wrong, distractors=tuple(w for r in reads for w in wrong[r]))
