"""The task types: each module plants its scenario in a fresh shop and writes the gold plan."""

from __future__ import annotations

from collections.abc import Callable

from rir_runtime.envs.shopdb.generate import ShopBuilder
from rir_runtime.envs.shopdb.tasks import merge_accounts, price_change, return_refund, stock_transfer
from rir_runtime.envs.shopdb.tasks.plan import TaskPlan

TASKS: dict[str, Callable[[ShopBuilder], TaskPlan]] = {
    "return-refund": return_refund.build,
    "stock-transfer": stock_transfer.build,
    "price-change": price_change.build,
    "merge-accounts": merge_accounts.build,
}
