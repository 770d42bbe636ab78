"""The procedural shop: customers, products, warehouses, stock, orders with lines, payments and
shipments, drawn from one seeded `random.Random` per variation.

Names come in near-twins (Maria/Mario Lopez, Jon/John Park): a task's customer usually has a
similar-named neighbour, which is what makes looking the wrong one up, or writing to the wrong
id, a plausible mistake. Task modules add the rows their scenario needs with the same builder.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from datetime import date, timedelta

from rir_runtime.envs.shopdb import schema
from rir_runtime.envs.shopdb.schema import TODAY

FIRST = (
    ("Maria", "Mario"),
    ("Anna", "Hanna"),
    ("Jon", "John"),
    ("Sara", "Sarah"),
    ("Eric", "Erik"),
    ("Lena", "Lana"),
    ("Marc", "Mark"),
    ("Nina", "Nino"),
    ("Carl", "Karl"),
    ("Ines", "Iris"),
    ("Tom", "Tim"),
    ("Ada", "Ida"),
    ("Rosa", "Rose"),
    ("Alan", "Allan"),
    ("Lucas", "Lukas"),
    ("Emil", "Emily"),
)
LAST = (
    ("Lopez", "Lopes"),
    ("Smith", "Smyth"),
    ("Meyer", "Maier"),
    ("Park", "Parks"),
    ("Novak", "Nowak"),
    ("Khan", "Kahn"),
    ("Silva", "Sylva"),
    ("Brown", "Braun"),
    ("Rossi", "Russo"),
    ("Berg", "Burg"),
)
CITIES = ("Leeds", "Porto", "Lyon", "Graz", "Turku", "Gdansk", "Bilbao", "Aarhus")
DEPOTS = ("North", "Central", "Depot", "Hub", "South")
CATALOGUE = {
    "kitchen": ("Kettle", "Teapot", "Skillet", "Whisk", "Colander", "Ladle", "Grater"),
    "garden": ("Trowel", "Hose", "Rake", "Planter", "Shears", "Sprinkler"),
    "office": ("Stapler", "Desk Lamp", "Notebook", "Binder", "Monitor Arm", "Pen Set"),
    "toys": ("Kite", "Puzzle", "Yo-yo", "Robot", "Marble Run", "Spinning Top"),
    "bath": ("Towel", "Bath Mat", "Soap Dish", "Robe", "Shower Caddy"),
    "camping": ("Lantern", "Tent", "Camp Stove", "Hammock", "Canteen", "Sleeping Bag"),
}
ADJECTIVES = ("Blue", "Steel", "Compact", "Classic", "Deluxe", "Mini", "Oak", "Copper")
CASE_SIZES = (4, 6, 10, 12)


def twin_name(name: str, rng: random.Random) -> str:
    """A near-twin of `name`: its first or its last name swapped for the look-alike."""
    first, last = name.split(" ", 1)
    options = [f"{pair[1 - pair.index(first)]} {last}" for pair in FIRST if first in pair]
    options += [f"{first} {pair[1 - pair.index(last)]}" for pair in LAST if last in pair]
    return rng.choice(options)


@dataclass(frozen=True)
class Line:
    product_id: int
    qty: int
    unit_cents: int


class ShopBuilder:
    """Inserts shop rows into a fresh database and hands out ids; task modules plant their rows here."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.conn: sqlite3.Connection = schema.connect()
        schema.create(self.conn)
        self._emails: set[str] = set()

    # --- rows ------------------------------------------------------------------------------
    def add_customer(
        self,
        name: str,
        *,
        tier: str | None = None,
        points: int | None = None,
        autopay: int | None = None,
        created: date | None = None,
    ) -> int:
        rng = self.rng
        first, last = name.lower().split(" ", 1)
        n = 0
        while (email := f"{first}.{last}{n or ''}@example.com") in self._emails:
            n = n + 1 if n else rng.randint(2, 99)
        self._emails.add(email)
        created = created or date(2019, 1, 1) + timedelta(days=rng.randint(0, 1900))
        cursor = self.conn.execute(
            "INSERT INTO customers (name, email, city, tier, points, autopay, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                email,
                rng.choice(CITIES),
                tier or ("gold" if rng.random() < 0.25 else "standard"),
                rng.randint(0, 900) if points is None else points,
                rng.randint(0, 1) if autopay is None else autopay,
                created.isoformat(),
            ),
        )
        return int(cursor.lastrowid or 0)

    def add_product(self, name: str, category: str) -> int:
        rng = self.rng
        cursor = self.conn.execute(
            "INSERT INTO products (name, category, price_cents, reorder_threshold, case_size) VALUES (?, ?, ?, ?, ?)",
            (name, category, rng.randint(300, 15000), rng.randint(10, 40), rng.choice(CASE_SIZES)),
        )
        return int(cursor.lastrowid or 0)

    def set_stock(self, product: int, warehouse: int, qty: int) -> None:
        self.conn.execute(
            "INSERT INTO stock (product_id, warehouse_id, qty) VALUES (?, ?, ?) "
            "ON CONFLICT (product_id, warehouse_id) DO UPDATE SET qty = excluded.qty",
            (product, warehouse, qty),
        )

    def add_order(
        self,
        customer: int,
        status: str,
        placed: date,
        lines: list[Line],
        warehouse: int | None = None,
        delivered: date | None = None,
    ) -> tuple[int, list[int]]:
        """An order with its lines, its payment (unless pending or cancelled) and its shipment
        (when shipped or delivered); the order id and the line ids."""
        total = sum(line.qty * line.unit_cents for line in lines)
        order = int(
            self.conn.execute(
                "INSERT INTO orders (customer_id, status, placed, total_cents) VALUES (?, ?, ?, ?)",
                (customer, status, placed.isoformat(), total),
            ).lastrowid
            or 0
        )
        line_ids = [
            int(
                self.conn.execute(
                    "INSERT INTO order_lines (order_id, product_id, qty, unit_cents) VALUES (?, ?, ?, ?)",
                    (order, line.product_id, line.qty, line.unit_cents),
                ).lastrowid
                or 0
            )
            for line in lines
        ]
        if status in ("paid", "shipped", "delivered"):
            self.conn.execute("INSERT INTO payments (order_id, amount_cents) VALUES (?, ?)", (order, total))
        if status in ("shipped", "delivered"):
            shipped = placed + timedelta(days=1)
            arrival = (delivered or shipped + timedelta(days=3)) if status == "delivered" else None
            self.conn.execute(
                "INSERT INTO shipments (order_id, warehouse_id, shipped, delivered) VALUES (?, ?, ?, ?)",
                (
                    order,
                    warehouse or self.rng.choice(self.warehouses()),
                    shipped.isoformat(),
                    arrival.isoformat() if arrival else None,
                ),
            )
        return order, line_ids

    # --- lookups ---------------------------------------------------------------------------
    def ids(self, sql: str, *args: object) -> list[int]:
        return [int(r[0]) for r in self.conn.execute(sql, args)]

    def warehouses(self) -> list[int]:
        return self.ids("SELECT warehouse_id FROM warehouses ORDER BY warehouse_id")

    def price(self, product: int) -> int:
        return self.ids("SELECT price_cents FROM products WHERE product_id = ?", product)[0]

    def name_of(self, customer: int) -> str:
        return str(self.conn.execute("SELECT name FROM customers WHERE customer_id = ?", (customer,)).fetchone()[0])

    def product_name(self, product: int) -> str:
        return str(self.conn.execute("SELECT name FROM products WHERE product_id = ?", (product,)).fetchone()[0])

    def customer_named(self, name: str) -> int | None:
        found = self.ids("SELECT customer_id FROM customers WHERE name = ? ORDER BY customer_id", name)
        return found[0] if found else None

    def line_of(self, product: int, qty: int | None = None) -> Line:
        return Line(product, qty or self.rng.randint(1, 4), self.price(product))

    def fresh_name(self) -> str:
        """A full name no customer has yet."""
        while True:
            name = f"{self.rng.choice(self.rng.choice(FIRST))} {self.rng.choice(self.rng.choice(LAST))}"
            if self.customer_named(name) is None:
                return name

    def with_twin(self, customer: int) -> int:
        """The id of a customer whose name is a near-twin of `customer`'s (created if needed)."""
        name = self.name_of(customer)
        twin = twin_name(name, self.rng)
        return self.customer_named(twin) or self.add_customer(twin)

    def placed_date(self, low: int = 5, high: int = 120) -> date:
        return TODAY - timedelta(days=self.rng.randint(low, high))


def build_shop(rng: random.Random) -> ShopBuilder:
    """The base shop every task starts from: ~25 customers, ~25 products, 3-4 warehouses, ~50 orders."""
    shop = ShopBuilder(rng)
    cities = rng.sample(CITIES, rng.randint(3, 4))
    for city in cities:
        shop.conn.execute("INSERT INTO warehouses (name, city) VALUES (?, ?)", (f"{city} {rng.choice(DEPOTS)}", city))
    for category, nouns in CATALOGUE.items():
        for noun in rng.sample(nouns, rng.randint(3, 5)):
            shop.add_product(f"{rng.choice(ADJECTIVES)} {noun}", category)
    products = shop.ids("SELECT product_id FROM products")
    for product in products:
        for warehouse in shop.warehouses():
            shop.set_stock(product, warehouse, rng.randint(0, 40))
    for _ in range(rng.randint(20, 26)):
        shop.add_customer(shop.fresh_name())
    customers = shop.ids("SELECT customer_id FROM customers")
    statuses = ("pending", "paid", "shipped", "delivered", "delivered", "cancelled")
    for _ in range(rng.randint(40, 55)):
        lines = [shop.line_of(p) for p in rng.sample(products, rng.randint(1, 3))]
        shop.add_order(rng.choice(customers), rng.choice(statuses), shop.placed_date(), lines)
    return shop
