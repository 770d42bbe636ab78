"""The controller protocol: drop-in When (review), Where (locate) and What (reflect) modules."""

from __future__ import annotations

from typing import Protocol

from rir_runtime.decisions import Decision
from rir_runtime.prompts import DecisionContext


class Controller(Protocol):
    name: str
    uses_model: bool  # its decisions are model calls, counted against B_agent
    uses_hindsight: bool  # it reads `ctx.hindsight` (the oracle); the loop provides it only then

    def review(self, ctx: DecisionContext) -> Decision: ...
    def locate_coarse(self, ctx: DecisionContext) -> Decision: ...
    def locate_fine(self, ctx: DecisionContext) -> Decision: ...
    def reflect(self, ctx: DecisionContext) -> Decision: ...
