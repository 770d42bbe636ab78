"""The shop's SQLite schema, and the money and date conventions every other module shares.

The constraints and triggers are the shop's business rules. They make a write that breaks a rule
fail *loudly* (the tool answers with the database's refusal) instead of corrupting the data, and
they make the order of writes matter: a refund needs the returned units recorded first, an
account can only be closed once its orders and points have moved.

Money is stored in integer cents (exact arithmetic, exact comparison with the gold database);
tools read and print dollars with two decimals.
"""

from __future__ import annotations

import sqlite3
from datetime import date
from decimal import Decimal, InvalidOperation
from functools import cache

TODAY = date(2024, 6, 30)  # the shop's "today": fixed, so a variation never depends on the clock

TEMPLATES = ("return_received", "refund_issued", "price_notice", "merge_notice", "accounts_merged", "order_shipped")
TIERS = ("standard", "gold")

DDL = """
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('standard', 'gold')),
    points INTEGER NOT NULL CHECK (points >= 0),
    autopay INTEGER NOT NULL CHECK (autopay IN (0, 1)),
    active INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),
    created TEXT NOT NULL
);
CREATE TABLE products (
    product_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    category TEXT NOT NULL,
    price_cents INTEGER NOT NULL CHECK (price_cents > 0),
    reorder_threshold INTEGER NOT NULL CHECK (reorder_threshold >= 0),
    case_size INTEGER NOT NULL CHECK (case_size > 0)
);
CREATE TABLE warehouses (
    warehouse_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL
);
CREATE TABLE stock (
    product_id INTEGER NOT NULL REFERENCES products,
    warehouse_id INTEGER NOT NULL REFERENCES warehouses,
    qty INTEGER NOT NULL CHECK (qty >= 0),
    PRIMARY KEY (product_id, warehouse_id)
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers,
    status TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled')),
    placed TEXT NOT NULL,
    total_cents INTEGER NOT NULL CHECK (total_cents >= 0)
);
CREATE TABLE order_lines (
    line_id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders,
    product_id INTEGER NOT NULL REFERENCES products,
    qty INTEGER NOT NULL CHECK (qty > 0),
    unit_cents INTEGER NOT NULL CHECK (unit_cents > 0),
    returned_qty INTEGER NOT NULL DEFAULT 0 CHECK (returned_qty BETWEEN 0 AND qty)
);
CREATE TABLE payments (
    payment_id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders,
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0)
);
CREATE TABLE refunds (
    refund_id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders,
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0)
);
CREATE TABLE shipments (
    shipment_id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL UNIQUE REFERENCES orders,
    warehouse_id INTEGER NOT NULL REFERENCES warehouses,
    shipped TEXT NOT NULL,
    delivered TEXT
);
CREATE TABLE loyalty_ledger (
    entry_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers,
    delta INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE stock_moves (
    move_id INTEGER PRIMARY KEY,
    product_id INTEGER NOT NULL REFERENCES products,
    warehouse_id INTEGER NOT NULL REFERENCES warehouses,
    delta INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE purchase_orders (
    po_id INTEGER PRIMARY KEY,
    product_id INTEGER NOT NULL REFERENCES products,
    warehouse_id INTEGER NOT NULL REFERENCES warehouses,
    qty INTEGER NOT NULL CHECK (qty > 0)
);

CREATE TRIGGER refund_within_payments BEFORE INSERT ON refunds
WHEN (SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = NEW.order_id) + NEW.amount_cents
   > (SELECT COALESCE(SUM(amount_cents), 0) FROM payments WHERE order_id = NEW.order_id)
BEGIN SELECT RAISE(ABORT, 'a refund cannot exceed what was paid on the order'); END;

CREATE TRIGGER refund_within_returns BEFORE INSERT ON refunds
WHEN (SELECT status FROM orders WHERE order_id = NEW.order_id) = 'delivered'
 AND (SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = NEW.order_id) + NEW.amount_cents
   > (SELECT COALESCE(SUM(returned_qty * unit_cents), 0) FROM order_lines WHERE order_id = NEW.order_id)
BEGIN SELECT RAISE(ABORT, 'a delivered order cannot be refunded beyond the value of its recorded returns'); END;

CREATE TRIGGER returns_only_delivered BEFORE UPDATE OF returned_qty ON order_lines
WHEN (SELECT status FROM orders WHERE order_id = NEW.order_id) <> 'delivered'
BEGIN SELECT RAISE(ABORT, 'returns cannot be recorded on an order that was not delivered'); END;

CREATE TRIGGER reprice_only_open BEFORE UPDATE OF unit_cents ON order_lines
WHEN (SELECT status FROM orders WHERE order_id = NEW.order_id) NOT IN ('pending', 'paid')
BEGIN SELECT RAISE(ABORT, 'only pending or paid orders can be repriced'); END;

CREATE TRIGGER reprice_updates_total AFTER UPDATE OF unit_cents ON order_lines
BEGIN
    UPDATE orders SET total_cents = (SELECT SUM(qty * unit_cents) FROM order_lines WHERE order_id = NEW.order_id)
    WHERE order_id = NEW.order_id;
END;

CREATE TRIGGER reassign_to_active BEFORE UPDATE OF customer_id ON orders
WHEN (SELECT active FROM customers WHERE customer_id = NEW.customer_id) IS NOT 1
BEGIN SELECT RAISE(ABORT, 'orders cannot move to an inactive or missing account'); END;

CREATE TRIGGER deactivate_empty_only BEFORE UPDATE OF active ON customers
WHEN NEW.active = 0 AND (
    NEW.points > 0
    OR EXISTS (SELECT 1 FROM orders WHERE customer_id = NEW.customer_id AND status <> 'cancelled'))
BEGIN SELECT RAISE(ABORT, 'an account cannot be deactivated while it holds open orders or points'); END;

CREATE TRIGGER purchase_whole_cases BEFORE INSERT ON purchase_orders
WHEN NEW.qty % (SELECT case_size FROM products WHERE product_id = NEW.product_id) <> 0
BEGIN SELECT RAISE(ABORT, 'purchase orders cannot be split: order whole cases of the product'); END;
"""

#: every table, in a fixed order; all of them are graded (any tool can write anywhere)
TABLES = (
    "customers",
    "products",
    "warehouses",
    "stock",
    "orders",
    "order_lines",
    "payments",
    "refunds",
    "shipments",
    "loyalty_ledger",
    "stock_moves",
    "purchase_orders",
)
#: entity tables: rows are compared by key (the first `n` columns)
KEY_COLUMNS = {
    "customers": 1,
    "products": 1,
    "warehouses": 1,
    "stock": 2,
    "orders": 1,
    "order_lines": 1,
    "payments": 1,
    "shipments": 1,
}
#: append-only ledgers: compared as multisets of rows without their surrogate id, so two correct
#: writes done in another order than the gold plan's still match
LEDGERS = ("refunds", "loyalty_ledger", "stock_moves", "purchase_orders")


@cache
def columns(table: str) -> tuple[str, ...]:
    """A table's column names in order, read once from the schema (a row change names its columns)."""
    conn = connect()
    create(conn)
    names = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
    conn.close()
    return names


def connect() -> sqlite3.Connection:
    """A fresh in-memory connection in autocommit mode (tools open their own savepoints)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def create(conn: sqlite3.Connection) -> None:
    conn.executescript(DDL)


def copy_of(data: bytes) -> sqlite3.Connection:
    """A private writable connection holding the serialized database `data`."""
    conn = connect()
    conn.deserialize(data)
    return conn


# --- money -------------------------------------------------------------------------------
def dollars(cents: int) -> str:
    """12345 -> '123.45' (exact: no float on the way)."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole}.{part:02d}"


def parse_cents(text: str) -> int | None:
    """'37.5' or '37.50' or '$37.50' -> 3750; None unless a number with at most two decimals."""
    try:
        value = Decimal(text.strip().lstrip("$"))
    except InvalidOperation:
        return None
    if not value.is_finite() or value != value.quantize(Decimal("0.01")):
        return None
    return int(value * 100)


def percent_of(cents: int, percent: int) -> int:
    """`percent`% of `cents`, rounded to the nearest cent, halves up (the policy's stated rounding)."""
    return (cents * percent + 50) // 100
