"""`shopdb`: an agent runs a shop's back office through tool calls on an in-memory SQLite database.

A procedurally generated shop per variation (customers, products, stock per warehouse, orders,
payments, refunds, shipments, loyalty points); four task types whose later writes depend on
earlier ones (`return-refund`, `stock-transfer`, `price-change`, `merge-accounts`); tools that
read (`query` is SELECT-only, enforced by SQLite's authorizer), write (typed arguments, business
rules enforced by constraints and triggers) and act outside the database (`send_email`,
`charge_card`: irreversible, so no restore may cross them). Success is the gold database and the
gold outbox, exactly. See docs/shopdb.md.

Modules: `schema` (tables, rules, money), `generate` (the procedural shop), `tasks/` (one module
per task type), `scenario` (a variation worked out: initial and gold databases), `tools` (the
catalogue and parser), `reads`, `readonly` (the `query` tool), `writes`, `grading`, `expert` (the
plan from any state and the valid actions), `env` (`ShopDBEnv`).
"""

from rir_runtime.envs.shopdb.env import ShopDBEnv

__all__ = ["ShopDBEnv"]
