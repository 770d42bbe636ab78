"""How a run names its agent: `noisy-expert` (the scripted, error-injected expert) or `llm:<model>` (an
LLM agent over a `make_backend` spec: a registered model, a folder, an adapter, a hub id or a server).

This is the one parser of that name: configs check it, workers and labellers build the agent from it,
and `--help` lists its spellings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rir_runtime.errors import UnknownNameError

NOISY_EXPERT = "noisy-expert"
LLM_PREFIX = "llm:"


@dataclass(frozen=True)
class PolicySpec:
    """A parsed agent name: its kind and, for an LLM agent, the model's backend spec."""

    kind: Literal["noisy-expert", "llm"]
    model: str = ""

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """The spec of `noisy-expert` or `llm:<model>`; any other name (an LLM without a model included)
        is refused with the valid spellings."""
        spec = cls.try_parse(text)
        if spec is None:
            raise UnknownNameError("policy", text, spellings())
        return spec

    @classmethod
    def try_parse(cls, text: str) -> PolicySpec | None:
        """The spec, or None where `text` names no agent."""
        if text == NOISY_EXPERT:
            return cls("noisy-expert")
        if text.startswith(LLM_PREFIX) and text[len(LLM_PREFIX) :]:
            return cls("llm", text[len(LLM_PREFIX) :])
        return None

    @property
    def is_llm(self) -> bool:
        return self.kind == "llm"

    def __str__(self) -> str:
        return f"{LLM_PREFIX}{self.model}" if self.is_llm else NOISY_EXPERT


def spellings(models: Iterable[str] = ("<model>",)) -> list[str]:
    """The ways to name an agent, with an LLM agent over each of `models`."""
    return [NOISY_EXPERT, *(f"{LLM_PREFIX}{m}" for m in models)]
