"""Hand-built episode records for tests of the readers (summary, pairing, replay)."""

from __future__ import annotations

from typing import Any

from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace import EpisodeRecord, Event


def episode_record(*events: Event, **fields: Any) -> EpisodeRecord:
    """A record with neutral defaults; `fields` override any of them."""
    values: dict[str, Any] = dict(
        env="builtin", task="workshop-3", split="dev", variation=0, method="rir", controller="heuristic",
        policy="noisy-expert", success=False, score=0.0, agent_calls=10, controller_calls=0, rollbacks=0,
        recoveries=0, env_steps=10, prompt_tokens=0, completion_tokens=0, wall_s=0.0, parse_failures=0,
        restore_divergences=0, oracle_env_steps=0, first_error_step=None, stop_reason="lost",
        memory=MemorySnapshot(), events=tuple(events), episode_id="e1", seed=0, budget_agent=60, budget_rollback=5,
    )  # fmt: skip
    values.update(fields)
    return EpisodeRecord(**values)
