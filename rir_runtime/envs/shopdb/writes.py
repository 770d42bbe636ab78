"""The write tools and the checks of the external ones.

Each write runs inside a savepoint: it changes the database completely or not at all. A rule the
database enforces (a CHECK, a trigger, a foreign key) answers as a `Refused` observation that
quotes SQLite's reason: a *loud* mistake. A write that obeys every rule but is not what the policy
asked for answers exactly like the right one: a *silent* mistake.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from rir_runtime.envs.shopdb.schema import dollars
from rir_runtime.envs.shopdb.tools import Call


class Refused(Exception):
    """A tool call that changed nothing; the message is the observation."""


def _exists(conn: sqlite3.Connection, table: str, key: str, value: int, what: str, tool: str) -> None:
    if conn.execute(f"SELECT 1 FROM {table} WHERE {key} = ?", (value,)).fetchone() is None:
        raise Refused(f"{tool} refused: there is no {what} #{value}; the call cannot run")


def _one(conn: sqlite3.Connection, sql: str, *args: object) -> int:
    return int(conn.execute(sql, args).fetchone()[0])


def _record_return(conn: sqlite3.Connection, line: int, qty: int) -> str:
    _exists(conn, "order_lines", "line_id", line, "order line", "record_return")
    conn.execute("UPDATE order_lines SET returned_qty = returned_qty + ? WHERE line_id = ?", (qty, line))
    done, of = conn.execute("SELECT returned_qty, qty FROM order_lines WHERE line_id = ?", (line,)).fetchone()
    return f"record_return: line #{line} now has {done} of {of} unit(s) returned"


def _refund(conn: sqlite3.Connection, order: int, cents: int) -> str:
    _exists(conn, "orders", "order_id", order, "order", "refund")
    refund_id = conn.execute("INSERT INTO refunds (order_id, amount_cents) VALUES (?, ?)", (order, cents)).lastrowid
    return f"refund: {dollars(cents)} refunded on order #{order} (refund #{refund_id})"


def _add_stock(conn: sqlite3.Connection, product: int, warehouse: int, delta: int, reason: str) -> int:
    # UPDATE, then INSERT when there was no row: an upsert would check the CHECK on the delta itself
    changed = conn.execute(
        "UPDATE stock SET qty = qty + ? WHERE product_id = ? AND warehouse_id = ?", (delta, product, warehouse)
    ).rowcount
    if not changed:
        conn.execute("INSERT INTO stock (product_id, warehouse_id, qty) VALUES (?, ?, ?)", (product, warehouse, delta))
    conn.execute(
        "INSERT INTO stock_moves (product_id, warehouse_id, delta, reason) VALUES (?, ?, ?, ?)",
        (product, warehouse, delta, reason),
    )
    return _one(conn, "SELECT qty FROM stock WHERE product_id = ? AND warehouse_id = ?", product, warehouse)


def _restock(conn: sqlite3.Connection, product: int, warehouse: int, qty: int) -> str:
    _exists(conn, "products", "product_id", product, "product", "restock")
    _exists(conn, "warehouses", "warehouse_id", warehouse, "warehouse", "restock")
    now = _add_stock(conn, product, warehouse, qty, "restock")
    return f"restock: product #{product} at warehouse #{warehouse} now has {now} unit(s)"


def _adjust_points(conn: sqlite3.Connection, customer: int, delta: int) -> str:
    _exists(conn, "customers", "customer_id", customer, "customer", "adjust_points")
    conn.execute("UPDATE customers SET points = points + ? WHERE customer_id = ?", (delta, customer))
    conn.execute(
        "INSERT INTO loyalty_ledger (customer_id, delta, reason) VALUES (?, ?, 'adjustment')", (customer, delta)
    )
    now = _one(conn, "SELECT points FROM customers WHERE customer_id = ?", customer)
    return f"adjust_points: customer #{customer} now has {now} point(s)"


def _transfer(conn: sqlite3.Connection, product: int, source: int, target: int, qty: int) -> str:
    if source == target:
        raise Refused("transfer refused: the two warehouses are the same; the call cannot run")
    _exists(conn, "products", "product_id", product, "product", "transfer")
    for warehouse in (source, target):
        _exists(conn, "warehouses", "warehouse_id", warehouse, "warehouse", "transfer")
    left = _add_stock(conn, product, source, -qty, "transfer")
    now = _add_stock(conn, product, target, qty, "transfer")
    return (
        f"transfer: moved {qty} unit(s) of product #{product} from warehouse #{source} (now {left}) "
        f"to warehouse #{target} (now {now})"
    )


def _reorder(conn: sqlite3.Connection, product: int, warehouse: int, qty: int) -> str:
    _exists(conn, "products", "product_id", product, "product", "reorder")
    _exists(conn, "warehouses", "warehouse_id", warehouse, "warehouse", "reorder")
    po = conn.execute(
        "INSERT INTO purchase_orders (product_id, warehouse_id, qty) VALUES (?, ?, ?)", (product, warehouse, qty)
    ).lastrowid
    return f"reorder: purchase order #{po} for {qty} unit(s) of product #{product} to warehouse #{warehouse}"


def _deactivate(conn: sqlite3.Connection, customer: int) -> str:
    _exists(conn, "customers", "customer_id", customer, "customer", "deactivate_customer")
    conn.execute("UPDATE customers SET active = 0 WHERE customer_id = ?", (customer,))
    return f"deactivate_customer: account #{customer} is closed"


def _set_price(conn: sqlite3.Connection, product: int, cents: int) -> str:
    _exists(conn, "products", "product_id", product, "product", "set_price")
    conn.execute("UPDATE products SET price_cents = ? WHERE product_id = ?", (cents, product))
    return f"set_price: product #{product} now costs {dollars(cents)}"


def _set_line_price(conn: sqlite3.Connection, line: int, cents: int) -> str:
    _exists(conn, "order_lines", "line_id", line, "order line", "set_line_price")
    conn.execute("UPDATE order_lines SET unit_cents = ? WHERE line_id = ?", (cents, line))
    order, total = conn.execute(
        "SELECT o.order_id, o.total_cents FROM orders o JOIN order_lines l ON l.order_id = o.order_id "
        "WHERE l.line_id = ?",
        (line,),
    ).fetchone()
    return f"set_line_price: line #{line} now costs {dollars(cents)} each; order #{order} total {dollars(total)}"


def _reassign(conn: sqlite3.Connection, order: int, customer: int) -> str:
    _exists(conn, "orders", "order_id", order, "order", "reassign_order")
    _exists(conn, "customers", "customer_id", customer, "customer", "reassign_order")
    conn.execute("UPDATE orders SET customer_id = ? WHERE order_id = ?", (customer, order))
    return f"reassign_order: order #{order} now belongs to customer #{customer}"


def _set_tier(conn: sqlite3.Connection, customer: int, tier: str) -> str:
    _exists(conn, "customers", "customer_id", customer, "customer", "set_tier")
    conn.execute("UPDATE customers SET tier = ? WHERE customer_id = ?", (tier, customer))
    return f"set_tier: customer #{customer} is now {tier}"


WRITES: dict[str, Callable[..., str]] = {
    "record_return": _record_return,
    "refund": _refund,
    "restock": _restock,
    "adjust_points": _adjust_points,
    "transfer": _transfer,
    "reorder": _reorder,
    "deactivate_customer": _deactivate,
    "set_price": _set_price,
    "set_line_price": _set_line_price,
    "reassign_order": _reassign,
    "set_tier": _set_tier,
}


def apply_write(conn: sqlite3.Connection, call: Call) -> str:
    """Run a write tool atomically; its observation, or `Refused` with nothing changed."""
    conn.execute("SAVEPOINT tool")
    try:
        text = WRITES[call.name](conn, *call.values)
    except sqlite3.IntegrityError as err:
        conn.execute("ROLLBACK TO tool")
        conn.execute("RELEASE tool")
        raise Refused(f"{call.name} refused: the database cannot accept it ({err})") from None
    except Refused:
        conn.execute("ROLLBACK TO tool")
        conn.execute("RELEASE tool")
        raise
    conn.execute("RELEASE tool")
    return text


def check_external(conn: sqlite3.Connection, call: Call) -> str:
    """Validate an external call (it acts outside the database) and describe what it did."""
    customer = int(call.values[0])
    row = conn.execute("SELECT email FROM customers WHERE customer_id = ?", (customer,)).fetchone()
    if row is None:
        raise Refused(f"{call.name} refused: there is no customer #{customer}; nothing was sent")
    if call.name == "send_email":
        return f"send_email: email '{call.values[1]}' sent to customer #{customer} <{row[0]}>"
    return f"charge_card: charged {dollars(int(call.values[1]))} to the card of customer #{customer}"
