"""`price-change`: a product's price changes; open orders follow it by a policy with branches.

The agent finds the product, lists its lines on open orders with a `query` (tier, autopay and
status decide each line), notifies and charges first (external, irreversible), then sets the
catalogue price and the lines, refunding paid orders on a drop. Shipped, delivered and cancelled
orders with the product are there too and must stay untouched (the database refuses to reprice
them: a loud mistake).
"""

from __future__ import annotations

from collections import defaultdict

from rir_runtime.envs.shopdb.generate import ADJECTIVES, CATALOGUE, ShopBuilder
from rir_runtime.envs.shopdb.schema import dollars, percent_of
from rir_runtime.envs.shopdb.tasks.plan import TaskPlan, variants
from rir_runtime.envs.shopdb.tools import op

POLICY = """Policy:
1. Before any other change, email the template price_notice to every customer who has an order line of the product
   whose price will change (one email per customer).
2. On a price rise, charge the card of each such customer with autopay on for the rise on their paid orders:
   qty x (new - old) summed over their paid lines, in one charge per customer.
3. Set the catalogue price (set_price).
4. Pending orders get the new price (set_line_price), except that on a rise gold-tier customers keep the old price.
   Paid orders: on a drop, set the new price and refund qty x (old - new) on that order; on a rise, only customers
   with autopay on get the new price (they were charged), the others keep the old price.
   Shipped, delivered and cancelled orders keep their prices.
Then finish."""

OPEN_LINES = (
    "SELECT l.line_id, l.order_id, o.status, o.customer_id, c.tier, c.autopay, l.qty, l.unit_cents "
    "FROM order_lines l JOIN orders o ON o.order_id = l.order_id "
    "JOIN customers c ON c.customer_id = o.customer_id "
    "WHERE l.product_id = {product} AND o.status IN ('pending', 'paid') ORDER BY l.line_id"
)
ALL_LINES = "SELECT l.line_id, l.order_id, l.qty, l.unit_cents FROM order_lines l WHERE l.product_id = {product}"
#: (status, tier, autopay) of the extra open orders planted beside the two every variation has;
#: None leaves the attribute to chance
EXTRA: tuple[tuple[str, str | None, int | None], ...] = (
    ("pending", "gold", None),
    ("pending", "standard", None),
    ("paid", None, 0),
    ("paid", None, 1),
    ("pending", "gold", None),
)


def _customer(shop: ShopBuilder, tier: str | None, autopay: int | None) -> int:
    found = shop.ids(
        "SELECT customer_id FROM customers WHERE (?1 IS NULL OR tier = ?1) AND (?2 IS NULL OR autopay = ?2) "
        "ORDER BY customer_id",
        tier,
        autopay,
    )
    if found and shop.rng.random() < 0.8:
        return shop.rng.choice(found)
    return shop.add_customer(shop.fresh_name(), tier=tier, autopay=autopay)


def _plant(shop: ShopBuilder, product: int, rise: bool) -> list[int]:
    """Open orders (the policy's cases) and closed ones (decoys) holding `product`; the decoy lines."""
    rng = shop.rng
    others = shop.ids("SELECT product_id FROM products WHERE product_id <> ?", product)
    # a pending line that always changes, and a paid one that changes too (on a rise: autopay)
    roles = [("pending", "standard", None), ("paid", None, 1 if rise else None)]
    roles += rng.sample(EXTRA, rng.randint(1, 3))
    for status, tier, autopay in roles:
        customer = _customer(shop, tier, autopay)
        lines = [shop.line_of(product)] + ([shop.line_of(rng.choice(others))] if rng.random() < 0.5 else [])
        rng.shuffle(lines)
        shop.add_order(customer, status, shop.placed_date(1, 20), lines)
    decoys = []
    for status in rng.sample(("shipped", "delivered", "cancelled"), rng.randint(1, 2)):
        customer = rng.choice(shop.ids("SELECT customer_id FROM customers"))
        _, line_ids = shop.add_order(customer, status, shop.placed_date(10, 60), [shop.line_of(product)])
        decoys += line_ids
    return decoys


def build(shop: ShopBuilder) -> TaskPlan:
    rng, conn = shop.rng, shop.conn
    category = rng.choice(sorted(CATALOGUE))
    name = next(
        n
        for n in (f"{rng.choice(ADJECTIVES)} {rng.choice(CATALOGUE[category])} Pro" for _ in range(100))
        if not shop.ids("SELECT product_id FROM products WHERE name = ?", n)
    )
    product = shop.add_product(name, category)
    old = shop.price(product)
    rise = rng.random() < 0.5
    pct = rng.randint(5, 30)
    new = old + percent_of(old, pct) if rise else old - percent_of(old, pct)
    decoys = _plant(shop, product, rise)

    changed: list[tuple[int, int]] = []  # (line, customer) of the lines the policy reprices
    kept: list[tuple[int, int]] = []
    charges: dict[int, int] = defaultdict(int)
    per_unit_charges: dict[int, int] = defaultdict(int)
    refunds: dict[int, tuple[int, int]] = {}
    for line, order, status, customer, tier, autopay, qty, unit in conn.execute(OPEN_LINES.format(product=product)):
        change = not (rise and tier == "gold") if status == "pending" else (not rise or autopay == 1)
        (changed if change else kept).append((line, customer))
        if change and status == "paid" and rise:
            charges[customer] += qty * (new - unit)
            per_unit_charges[customer] += new - unit
        if change and status == "paid" and not rise:
            refunds[line] = (order, qty * (unit - new))
    affected = sorted({c for _, c in changed})

    reads = (op("find_product", name), op("query", OPEN_LINES.format(product=product)))
    wrong: dict[str, tuple[str, ...]] = {
        reads[0]: (op("find_product", category),),
        reads[1]: (op("query", ALL_LINES.format(product=product)),),
    }
    steps: list[str] = list(reads)
    kept_customer = kept[0][1] if kept else None
    for customer in affected:
        email = op("send_email", customer, "price_notice")
        steps.append(email)
        wrong[email] = variants(
            email,
            op("send_email", shop.with_twin(customer), "price_notice"),
            op("send_email", kept_customer, "price_notice") if kept_customer else None,  # the other branch
        )
    for customer, cents in sorted(charges.items()):
        charge = op("charge_card", customer, cents)
        steps.append(charge)
        wrong[charge] = variants(charge, op("charge_card", customer, per_unit_charges[customer]))  # qty forgotten
    set_price = op("set_price", product, new)
    steps.append(set_price)
    wrong[set_price] = variants(set_price, op("set_price", product, new + 100), op("set_price", product, old))
    for line, _ in changed:
        reprice = op("set_line_price", line, new)
        steps.append(reprice)
        wrong[reprice] = variants(
            reprice,
            op("set_line_price", kept[0][0], new) if kept else None,  # the other branch of the policy
            op("set_line_price", decoys[0], new),  # a closed order: refused
        )
        if line in refunds:
            order, cents = refunds[line]
            refund = op("refund", order, cents)
            steps.append(refund)
            wrong[refund] = variants(
                refund, op("refund", order, old - new), op("refund", order, cents + 100), op("refund", order, cents - 1)
            )

    objective = (
        f"The price of {name} changes from {dollars(old)} to {dollars(new)} today. "
        f"Apply the change to open orders by this policy.\n{POLICY}"
    )
    return TaskPlan(objective, tuple(steps), wrong, distractors=tuple(w for r in reads for w in wrong[r]))
