"""The read tools: short, fixed-format text views of the shop (what an agent uses to find ids)."""

from __future__ import annotations

import sqlite3

from rir_runtime.envs.shopdb.readonly import run_query
from rir_runtime.envs.shopdb.schema import dollars
from rir_runtime.envs.shopdb.tools import Call

MAX_MATCHES = 12


def _customer(row: tuple) -> str:
    cid, name, email, city, tier, points, autopay, active, created = row
    return (
        f"customer #{cid} {name} <{email}> city={city} tier={tier} points={points} "
        f"autopay={'on' if autopay else 'off'} active={'yes' if active else 'no'} created={created}"
    )


def lookup_customer(conn: sqlite3.Connection, text: str) -> str:
    rows = conn.execute(
        "SELECT * FROM customers WHERE name LIKE ?1 OR email LIKE ?1 ORDER BY customer_id", (f"%{text}%",)
    ).fetchall()
    if not rows:
        return f"lookup_customer: no customer name or email contains '{text}'"
    shown = [_customer(r) for r in rows[:MAX_MATCHES]]
    more = f"\n({len(rows) - MAX_MATCHES} more; be more specific)" if len(rows) > MAX_MATCHES else ""
    return f"lookup_customer '{text}': {len(rows)} match(es)\n" + "\n".join(shown) + more


def list_orders(conn: sqlite3.Connection, customer_id: int) -> str:
    if conn.execute("SELECT 1 FROM customers WHERE customer_id = ?", (customer_id,)).fetchone() is None:
        return f"list_orders: there is no customer #{customer_id}"
    rows = conn.execute(
        "SELECT order_id, status, placed, total_cents FROM orders WHERE customer_id = ? ORDER BY order_id",
        (customer_id,),
    ).fetchall()
    if not rows:
        return f"list_orders: customer #{customer_id} has no orders"
    body = "\n".join(f"order #{o} {s} placed={p} total={dollars(t)}" for o, s, p, t in rows)
    return f"list_orders: customer #{customer_id} has {len(rows)} order(s)\n{body}"


def get_order(conn: sqlite3.Connection, order_id: int) -> str:
    head = conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
    if head is None:
        return f"get_order: there is no order #{order_id}"
    _, cid, status, placed, total = head
    lines = conn.execute(
        "SELECT l.line_id, l.product_id, p.name, l.qty, l.unit_cents, l.returned_qty FROM order_lines l "
        "JOIN products p ON p.product_id = l.product_id WHERE l.order_id = ? ORDER BY l.line_id",
        (order_id,),
    ).fetchall()
    paid = conn.execute("SELECT amount_cents FROM payments WHERE order_id = ? ORDER BY payment_id", (order_id,))
    refunded = conn.execute("SELECT amount_cents FROM refunds WHERE order_id = ? ORDER BY refund_id", (order_id,))
    ship = conn.execute(
        "SELECT s.warehouse_id, w.name, s.shipped, s.delivered FROM shipments s "
        "JOIN warehouses w ON w.warehouse_id = s.warehouse_id WHERE s.order_id = ?",
        (order_id,),
    ).fetchone()
    out = [f"order #{order_id} customer #{cid} status={status} placed={placed} total={dollars(total)}"]
    out += [
        f"  line #{line} product #{pid} {name} qty={qty} unit={dollars(unit)} returned={ret}"
        for line, pid, name, qty, unit, ret in lines
    ]
    out.append("  payments: " + (", ".join(dollars(a) for (a,) in paid) or "none"))
    out.append("  refunds: " + (", ".join(dollars(a) for (a,) in refunded) or "none"))
    if ship is None:
        out.append("  shipment: not shipped")
    else:
        wid, wname, shipped, delivered = ship
        out.append(f"  shipment: from warehouse #{wid} {wname} shipped={shipped} delivered={delivered or 'not yet'}")
    return "\n".join(out)


def find_product(conn: sqlite3.Connection, text: str) -> str:
    rows = conn.execute(
        "SELECT * FROM products WHERE name LIKE ?1 OR category LIKE ?1 ORDER BY product_id", (f"%{text}%",)
    ).fetchall()
    if not rows:
        return f"find_product: no product name or category contains '{text}'"
    body = "\n".join(
        f"product #{pid} {name} category={cat} price={dollars(price)} reorder_threshold={th} case_size={case}"
        for pid, name, cat, price, th, case in rows[:MAX_MATCHES]
    )
    return f"find_product '{text}': {len(rows)} match(es)\n{body}"


def get_stock(conn: sqlite3.Connection, product_id: int) -> str:
    product = conn.execute("SELECT name FROM products WHERE product_id = ?", (product_id,)).fetchone()
    if product is None:
        return f"get_stock: there is no product #{product_id}"
    rows = conn.execute(
        "SELECT w.warehouse_id, w.name, COALESCE(s.qty, 0) FROM warehouses w LEFT JOIN stock s "
        "ON s.warehouse_id = w.warehouse_id AND s.product_id = ? ORDER BY w.warehouse_id",
        (product_id,),
    ).fetchall()
    body = "; ".join(f"warehouse #{w} {name}: {qty}" for w, name, qty in rows)
    return f"get_stock: product #{product_id} {product[0]}: {body}"


def list_warehouses(conn: sqlite3.Connection) -> str:
    rows = conn.execute("SELECT warehouse_id, name, city FROM warehouses ORDER BY warehouse_id").fetchall()
    return "list_warehouses:\n" + "\n".join(f"warehouse #{w} {name} city={city}" for w, name, city in rows)


def run_read(conn: sqlite3.Connection, call: Call) -> str:
    """The observation of a read tool call."""
    name, values = call.name, call.values
    if name == "lookup_customer":
        return lookup_customer(conn, str(values[0]))
    if name == "list_orders":
        return list_orders(conn, int(values[0]))
    if name == "get_order":
        return get_order(conn, int(values[0]))
    if name == "find_product":
        return find_product(conn, str(values[0]))
    if name == "get_stock":
        return get_stock(conn, int(values[0]))
    if name == "list_warehouses":
        return list_warehouses(conn)
    if name == "query":
        return run_query(conn, str(values[0]))
    raise ValueError(f"{name} is not a read tool")
