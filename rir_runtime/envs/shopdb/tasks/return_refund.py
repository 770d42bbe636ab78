"""`return-refund`: a customer returns some units of a delivered order.

The agent finds the customer (a near-twin exists), the order (by the date it was placed; an older
order of the same customer holds one of the same products), then: the acknowledgement email, the
returned units on each line, one refund (with a restocking fee when the delivery is more than 30
days old), the units back into the shipping warehouse, and the loyalty points taken back (capped
at what the customer has). The refund needs the returns recorded first: the database refuses a
refund beyond the value of the recorded returns.
"""

from __future__ import annotations

from datetime import timedelta

from rir_runtime.envs.shopdb.generate import ShopBuilder
from rir_runtime.envs.shopdb.schema import TODAY, percent_of
from rir_runtime.envs.shopdb.tasks.plan import TaskPlan, variants
from rir_runtime.envs.shopdb.tools import op

FEE_PERCENT = 15
FEE_AFTER_DAYS = 30

POLICY = f"""Policy:
1. Find the customer and the order (by the date it was placed). Before any database change, email the customer
   the template return_received.
2. Record the returned units on each order line (record_return).
3. Refund the returned units at the unit price paid on the order, in one refund on that order. If the order was
   delivered more than {FEE_AFTER_DAYS} days before today ({TODAY.isoformat()}), keep a {FEE_PERCENT}% restocking
   fee: refund the value minus {FEE_PERCENT}% of it, the fee rounded to the nearest cent (halves up).
4. Put the returned units back in stock at the warehouse that shipped the order (restock).
5. Take back the loyalty points earned on the returned units: one point per whole dollar of their value before any
   fee (adjust_points with a negative delta); if the customer has fewer points, take all they have.
Then finish."""


def build(shop: ShopBuilder) -> TaskPlan:
    rng, conn = shop.rng, shop.conn
    customer = rng.choice(shop.ids("SELECT customer_id FROM customers"))
    twin = shop.with_twin(customer)
    name = shop.name_of(customer)
    warehouses = shop.warehouses()
    home = rng.choice(warehouses)
    elsewhere = rng.choice([w for w in warehouses if w != home])
    n = rng.choice((1, 1, 2, 2, 3))
    products = rng.sample(shop.ids("SELECT product_id FROM products"), n + 1)

    late = rng.random() < 0.5
    delivered = TODAY - timedelta(days=rng.randint(31, 75) if late else rng.randint(3, 29))
    taken = {d for (d,) in conn.execute("SELECT placed FROM orders WHERE customer_id = ?", (customer,))}
    placed = delivered - timedelta(days=rng.randint(3, 6))
    while placed.isoformat() in taken:
        placed -= timedelta(days=1)
    lines = [shop.line_of(p, rng.randint(1, 4)) for p in products[:n]]
    if rng.random() < 0.5:
        lines.append(shop.line_of(products[n]))  # a line that is not returned
    order, line_ids = shop.add_order(customer, "delivered", placed, lines, home, delivered)
    decoy_placed = placed - timedelta(days=rng.randint(10, 40))
    decoy, decoy_lines = shop.add_order(
        customer,
        "delivered",
        decoy_placed,
        [shop.line_of(products[0], 3), shop.line_of(products[n])],
        elsewhere,
        decoy_placed + timedelta(days=4),
    )

    returned = [(line_ids[i], lines[i].product_id, rng.randint(1, lines[i].qty)) for i in range(n)]
    value = sum(q * lines[i].unit_cents for i, (_, _, q) in enumerate(returned))
    fee = percent_of(value, FEE_PERCENT)
    amount = value - fee if late else value
    earned = value // 100
    points = rng.randint(1, earned - 1) if earned > 1 and rng.random() < 0.3 else earned + rng.randint(0, 600)
    conn.execute("UPDATE customers SET points = ? WHERE customer_id = ?", (points, customer))
    take = min(points, earned)

    email = op("send_email", customer, "return_received")
    records = [op("record_return", line, q) for line, _, q in returned]
    refund = op("refund", order, amount)
    restocks = [op("restock", p, home, q) for _, p, q in returned]
    points_back = op("adjust_points", customer, -take)
    reads = (op("lookup_customer", name), op("list_orders", customer), op("get_order", order))

    wrong = {
        reads[0]: variants(reads[0], op("lookup_customer", shop.name_of(twin))),
        reads[1]: variants(reads[1], op("list_orders", twin)),
        reads[2]: variants(reads[2], op("get_order", decoy)),
        email: variants(email, op("send_email", twin, "return_received"), op("send_email", customer, "refund_issued")),
        refund: variants(
            refund,
            op("refund", order, value if late else value - fee),  # the other branch of the fee rule
            op("refund", order, amount - 100) if amount > 100 else None,
            op("refund", order, amount + 100),
            op("refund", decoy, amount),
        ),
        points_back: variants(
            points_back,
            op("adjust_points", customer, -earned),  # the cap forgotten: refused when points are short
            op("adjust_points", customer, -max(1, amount // 100)),  # points on the refund after the fee
            op("adjust_points", twin, -take),
            op("adjust_points", customer, take),
        ),
    }
    for i, (line, product, q) in enumerate(returned):
        same_product = decoy_lines[0] if product == products[0] else None
        wrong[records[i]] = variants(
            records[i],
            op("record_return", line, q + 1),
            op("record_return", same_product, q) if same_product else None,
        )
        wrong[restocks[i]] = variants(
            restocks[i], op("restock", product, elsewhere, q), op("restock", product, home, q + 1)
        )

    items = " and ".join(f"{q} x {shop.product_name(p)}" for _, p, q in returned)
    objective = f"Customer {name} is returning {items} from the order placed on {placed.isoformat()}.\n{POLICY}"
    steps = (*reads, email, *records, refund, *restocks, points_back)
    return TaskPlan(objective, steps, wrong, distractors=tuple(w for r in reads for w in wrong[r]))
