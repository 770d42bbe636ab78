"""The tool catalogue and the parser from a text action to a typed tool call.

An action is `<tool> <arguments>`. Every argument has a type (an id, a quantity, a dollar amount,
a template name); a bad argument becomes a `Refusal` that names the problem, never an exception
out of `step`. A parsed call has one canonical text (amounts with two decimals, single spaces),
which is what the gold plan, the outbox and the expert compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rir_runtime.envs.shopdb.schema import TEMPLATES, TIERS, dollars, parse_cents

ArgKind = Literal["id", "qty", "delta", "amount", "template", "tier", "text"]
ToolKind = Literal["read", "append", "set", "external", "finish"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool. `kind`: `read` never writes; `append` writes what no tool can take back (a ledger
    row, a returned unit, a closed account); `set` overwrites a field, so a later call can correct it;
    `external` acts outside the database (irreversible); `finish` ends the episode."""

    name: str
    args: tuple[tuple[str, ArgKind], ...]
    kind: ToolKind
    help: str

    @property
    def usage(self) -> str:
        return " ".join([self.name, *(f"<{arg}>" for arg, _ in self.args)])


TOOLS: dict[str, ToolSpec] = {
    t.name: t
    for t in (
        ToolSpec("lookup_customer", (("name or email", "text"),), "read", "customers whose name or email contains it"),
        ToolSpec("list_orders", (("customer_id", "id"),), "read", "a customer's orders"),
        ToolSpec("get_order", (("order_id", "id"),), "read", "an order's lines, payments, refunds and shipment"),
        ToolSpec("find_product", (("name or category", "text"),), "read", "products by name or category"),
        ToolSpec("get_stock", (("product_id", "id"),), "read", "a product's stock in every warehouse"),
        ToolSpec("list_warehouses", (), "read", "all warehouses"),
        ToolSpec("query", (("sql", "text"),), "read", "one read-only SQL SELECT"),
        ToolSpec("record_return", (("line_id", "id"), ("qty", "qty")), "append", "record returned units of a line"),
        ToolSpec("refund", (("order_id", "id"), ("amount", "amount")), "append", "refund money on an order"),
        ToolSpec(
            "restock", (("product_id", "id"), ("warehouse_id", "id"), ("qty", "qty")), "append", "add units to stock"
        ),
        ToolSpec("adjust_points", (("customer_id", "id"), ("delta", "delta")), "append", "add or take loyalty points"),
        ToolSpec(
            "transfer",
            (("product_id", "id"), ("from_warehouse_id", "id"), ("to_warehouse_id", "id"), ("qty", "qty")),
            "append",
            "move units between warehouses",
        ),
        ToolSpec(
            "reorder",
            (("product_id", "id"), ("warehouse_id", "id"), ("qty", "qty")),
            "append",
            "place a purchase order",
        ),
        ToolSpec("deactivate_customer", (("customer_id", "id"),), "append", "close an account"),
        ToolSpec("set_price", (("product_id", "id"), ("amount", "amount")), "set", "a product's catalogue price"),
        ToolSpec("set_line_price", (("line_id", "id"), ("amount", "amount")), "set", "an order line's unit price"),
        ToolSpec("reassign_order", (("order_id", "id"), ("customer_id", "id")), "set", "move an order to an account"),
        ToolSpec("set_tier", (("customer_id", "id"), ("tier", "tier")), "set", "a customer's tier (standard, gold)"),
        ToolSpec("send_email", (("customer_id", "id"), ("template", "template")), "external", "email a customer"),
        ToolSpec("charge_card", (("customer_id", "id"), ("amount", "amount")), "external", "charge a customer's card"),
        ToolSpec("finish", (), "finish", "end the task (it is graded then)"),
    )
}
Value = int | str


@dataclass(frozen=True)
class Call:
    """A parsed tool call: its spec and typed arguments (amounts in cents)."""

    spec: ToolSpec
    values: tuple[Value, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> ToolKind:
        return self.spec.kind

    @property
    def canonical(self) -> str:
        parts = [self.spec.name]
        for (_, arg_kind), value in zip(self.spec.args, self.values, strict=True):
            parts.append(dollars(int(value)) if arg_kind == "amount" else str(value))
        return " ".join(parts)


@dataclass(frozen=True)
class Refusal:
    """Why an action is not a valid tool call (shown to the agent as the observation)."""

    message: str


def tool_list() -> str:
    """The tools, one per line: the reset observation shows them."""
    return "\n".join(f"  {t.usage}: {t.help}" for t in TOOLS.values())


def _convert(tool: str, arg: str, kind: ArgKind, text: str) -> Value | Refusal:
    if kind in ("id", "qty", "delta"):
        try:
            number = int(text)
        except ValueError:
            return Refusal(f"{tool}: <{arg}> must be a whole number, got '{text}'; the call cannot run")
        if kind == "delta" and number == 0:
            return Refusal(f"{tool}: <{arg}> cannot be 0; the call cannot run")
        if kind != "delta" and number <= 0:
            return Refusal(f"{tool}: <{arg}> must be positive, got {number}; the call cannot run")
        return number
    if kind == "amount":
        cents = parse_cents(text)
        if cents is None or cents <= 0:
            return Refusal(
                f"{tool}: <{arg}> must be a positive dollar amount with at most 2 decimals, got '{text}'; "
                "the call cannot run"
            )
        return cents
    choices = TEMPLATES if kind == "template" else TIERS
    if text.lower() not in choices:
        return Refusal(f"{tool}: unknown {kind} '{text}'; use one of: {', '.join(choices)}; the call cannot run")
    return text.lower()


def parse(action: str) -> Call | Refusal:
    """`action` as a typed call, or the refusal that says what is wrong with it."""
    tool, _, rest = action.strip().partition(" ")
    spec = TOOLS.get(tool.lower())
    if spec is None:
        return Refusal(f"unknown tool '{tool}'. Tools: {', '.join(TOOLS)}")
    rest = " ".join(rest.split())
    if spec.args and spec.args[-1][1] == "text":  # a free-text tool takes the rest of the line
        if not rest:
            return Refusal(f"{spec.name} needs an argument, {spec.usage}; the call cannot run without it")
        return Call(spec, (rest,))
    words = rest.split()
    if len(words) != len(spec.args):
        got = f"'{rest}'" if rest else "nothing"
        return Refusal(f"{spec.name} takes {len(spec.args)} argument(s), {spec.usage}; got {got}, so it cannot run")
    values: list[Value] = []
    for (arg, kind), word in zip(spec.args, words, strict=True):
        value = _convert(spec.name, arg, kind, word)
        if isinstance(value, Refusal):
            return value
        values.append(value)
    return Call(spec, tuple(values))


def canonical(action: str) -> str:
    """The canonical text of a valid call; the stripped action itself otherwise."""
    call = parse(action)
    return call.canonical if isinstance(call, Call) else action.strip()


def op(tool: str, *values: Value) -> str:
    """The canonical text of a call built from typed values (amounts in cents): how plans are written."""
    return Call(TOOLS[tool], tuple(values)).canonical


def kind_of(action: str) -> ToolKind | None:
    """The kind of the tool `action` calls (None for an invalid action)."""
    call = parse(action)
    return call.kind if isinstance(call, Call) else None
