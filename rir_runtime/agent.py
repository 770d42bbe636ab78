"""The agent's contract: what a policy sees (`AgentContext`), what it answers (`AgentAction`), and the
`Policy` protocol every agent meets (the LLM agent and the scripted expert in `policies.py`).

It sits below the policies, the prompts and the hindsight values, so each of them can name the
agent without importing another's implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, Protocol

from rir_runtime.envs.base import Env
from rir_runtime.envs.checkpoints import Step
from rir_runtime.guidance import Guidance, GuidedChoice
from rir_runtime.memory import ReflectionMemory

NO_GUIDANCE = Guidance()


@dataclass(frozen=True)
class AgentContext:
    """What the policy sees. Valid actions are listed on first use only: on ScienceWorld listing
    them costs more than a step, and the scripted expert rarely needs them."""

    task: str
    objective: str
    memory: ReflectionMemory
    history: tuple[Step, ...]
    observation: str
    list_actions: Callable[[], list[str]]
    guidance: Guidance = NO_GUIDANCE  # how the memory's failure records act on the choice

    @cached_property
    def actions(self) -> list[str]:
        return self.list_actions()


@dataclass(frozen=True)
class AgentAction:
    kind: Literal["task", "rollback", "respond"]
    text: str
    reason: str = ""
    target: int | None = None  # rollback: a checkpoint the agent asks for (validated by the loop)
    injected_error: bool = False  # scripted expert: this action is a deliberate mistake
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failure: bool = False
    guided: GuidedChoice | None = None  # what memory guidance changed at this step, if it acted


class Policy(Protocol):
    name: str

    def act(self, ctx: AgentContext) -> AgentAction: ...

    def fork(self, env: Env, k: int) -> Policy:
        """A copy that acts on `env` as this agent would from here on (continuation k of `V_agent`;
        k = 0 is the agent's own future), leaving this one untouched."""
        ...
