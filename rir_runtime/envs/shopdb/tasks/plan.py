"""What a task type knows that the database does not.

The objective states the policy to apply and names the people and things the agent must look up.
The gold steps are the reads, then the writes and external calls, in an order the shop's rules
accept. For each gold step, `wrong` lists the plausible wrong versions an error-injected agent may
take instead: a similar-named customer, an amount off by a dollar, the other branch of the policy,
a write the database refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskPlan:
    objective: str
    steps: tuple[str, ...]  # canonical gold actions, without the final `finish`
    wrong: dict[str, tuple[str, ...]] = field(default_factory=dict)
    distractors: tuple[str, ...] = ()  # wrong reads worth listing among the valid actions


def variants(right: str, *candidates: str | None) -> tuple[str, ...]:
    """The distinct candidates that differ from `right` (None drops out)."""
    return tuple(dict.fromkeys(c for c in candidates if c and c != right))
