"""The `Backend` protocol: what policies, controllers and structured reflections may ask of a model.

Every backend and wrapper implements all of it (local transformers, tuned adapters, OpenAI-compatible
servers, cross-episode batching), so a wrapper cannot silently drop a capability: a backend that
cannot score says so in `supports_scoring`, and its `score` and `choose` raise a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Messages = list[dict[str, str]]
Prompt = Messages | str
Choice = tuple[Prompt, list[str], Sequence[float] | None]  # a `choose` call: prompt, choices, penalties


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int


@runtime_checkable
class Backend(Protocol):
    """A model that generates, and (when `supports_scoring`) scores continuations and spells choices."""

    @property
    def name(self) -> str:
        """What the model is, for run records: `transformers:<name>`, `tuned:<dir>`, `openai:<model>@<url>`."""
        ...

    @property
    def supports_scoring(self) -> bool:
        """Whether `score` and `choose` work; callers pick ranking over free generation by it."""
        ...

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int,
        stop: list[str] | None = None,
        temperature: float = 0.0,
        hints: Sequence[Sequence[str]] | None = None,
    ) -> list[Completion]:
        """One completion per prompt; chat prompts get the model's chat template. `hints[i]`: replies
        prompt i is likely to get (an agent's admissible actions); a local model decodes greedily along
        them in one pass while its choice stays among them, with the same result. Others ignore them."""
        ...

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]:
        """Summed log-likelihood of each continuation right after the (rendered) prompt."""
        ...

    def score_many(self, requests: Sequence[tuple[Prompt, list[str]]]) -> list[list[float]]:
        """`score` of many (prompt, continuations) requests at once (a local model: one batched pass)."""
        ...

    def choose(
        self, prompt: Prompt, choices: list[str], penalties: Sequence[float] | None = None
    ) -> tuple[int, Completion]:
        """Greedy decoding that can only spell one of `choices`: (its index, the completion);
        `penalties[i]` is subtracted from choice i's log-probability."""
        ...

    def choose_many(self, requests: Sequence[Choice]) -> list[tuple[int, Completion]]:
        """`choose` of many (prompt, choices, penalties) requests at once (a server: concurrently)."""
        ...


def truncate_at_stop(text: str, stop: list[str] | None) -> str:
    """Cut at the earliest stop string (servers and stop_strings may overshoot by a token)."""
    cuts = [i for s in stop or [] if s and (i := text.find(s)) >= 0]
    return text[: min(cuts)] if cuts else text
