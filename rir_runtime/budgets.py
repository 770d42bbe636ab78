"""Episode budgets. `B_agent` may be absolute (60 model calls) or relative to the task's expert
path length (`1.5x`): a fixed budget runs out on long task types before even the expert finishes,
so every method fails them alike and they measure nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rir_runtime.errors import UserInputError

_SPEC = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(x?)\s*$")


@dataclass(frozen=True)
class AgentBudget:
    """`B_agent` as given: `amount` model calls, or `amount` times the expert's path length."""

    amount: float
    relative: bool = False

    @classmethod
    def parse(cls, spec: str | int | float) -> AgentBudget:
        match = _SPEC.match(str(spec))
        if not match:
            raise UserInputError(
                f"agent budget '{spec}' is neither a count of model calls (60) nor a multiple of the "
                "expert's path length (1.5x)"
            )
        amount, relative = float(match.group(1)), bool(match.group(2))
        if not relative and amount != int(amount):
            raise UserInputError(f"agent budget '{spec}': a count of model calls is a whole number (or add x)")
        return cls(amount, relative)

    def __str__(self) -> str:
        return f"{self.amount:g}x" if self.relative else f"{int(self.amount)}"

    def resolve(self, expert_steps: int | None) -> int:
        """The model calls this episode may make; a relative budget needs the expert's path length."""
        if not self.relative:
            return int(self.amount)
        if not expert_steps:
            raise UserInputError(
                f"agent budget {self} is relative to the expert's path, but this task has no expert "
                "plan: give an absolute budget (e.g. 60)"
            )
        return math.ceil(self.amount * expert_steps)


@dataclass(frozen=True)
class Budgets:
    """What one episode may spend.

    `agent` (B_agent) bounds the agent's own model calls. A separate controller's model calls are
    counted apart and bounded by `controller` (B_ctrl; None: unbounded): the setting this project
    serves is a small controller beside a large agent, where a controller call costs far less than
    an agent call. `charge_controller` charges them to B_agent instead, for the setting where the
    agent's own model reviews itself (and the accounting of every figure measured before 0.2).
    """

    agent: int | AgentBudget = 60  # B_agent: the agent's model calls (and the controller's, when charged)
    rollback: int = 5  # B_rb: recoveries
    max_steps: int = 100  # environment steps per episode, a safety cap
    controller: int | None = None  # B_ctrl: the controller's model calls; None: unbounded
    charge_controller: bool = False  # the controller's model calls count against B_agent instead

    def __post_init__(self) -> None:
        agent = self.agent.amount if isinstance(self.agent, AgentBudget) else self.agent
        if agent < 0 or self.rollback < 0 or self.max_steps < 1 or (self.controller or 0) < 0:
            raise ValueError("budgets must be >= 0 (agent, rollback, controller) and max_steps >= 1")
        if self.charge_controller and self.controller is not None:
            raise ValueError(
                "charge_controller counts the controller's calls against B_agent: drop budget_controller, or "
                "drop charge_controller to bound them apart"
            )

    @property
    def relative_agent(self) -> bool:
        return isinstance(self.agent, AgentBudget) and self.agent.relative

    def agent_calls(self, expert_steps: int | None) -> int:
        """B_agent for one episode (a relative budget resolved against its expert path)."""
        return self.agent.resolve(expert_steps) if isinstance(self.agent, AgentBudget) else self.agent
