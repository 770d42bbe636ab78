"""Where a GRPO step's seconds go. TRL logs a step's total (`step_time`); this splits it into

- `time/generation_s`: sampling the completions,
- `time/rewards_s`: the reward functions (for the online reward: restoring decision points and
  playing the sampled decisions out),
- `time/scoring_s`: the rest of making a batch (the old and reference log-probabilities),
- `time/backward_s`: the loss's forward and backward passes and the optimizer step,

each in seconds per optimizer step, averaged over the logging period. The split says whether a GPU
trainer would wait on CPU environments (rewards) or on its own sampling (generation). Only training
steps count: evaluation's generations happen outside them. The value controller's option policy
(`train/value_grpo.py`) samples by scoring its options, so there `generation` is that forward pass
(`OPTION_TIMED`).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

# the GRPOTrainer methods timed (TRL 1.16): the whole batch preparation, and two parts of it
TIMED = {"prepare": "_generate_and_score_completions", "generation": "_generate", "rewards": "_calculate_rewards"}
# the option policy's: the loss's making (options scored, sampled, rewarded), and two parts of it
OPTION_TIMED = {"prepare": "compute_loss", "generation": "log_probs", "rewards": "rewards"}


class StepPhases(TrainerCallback):
    """Times the trainer's phases inside each optimizer step and adds the split to the train logs."""

    def __init__(self, timed: dict[str, str] | None = None) -> None:
        self.timed = timed or TIMED
        self.totals: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.in_step = False
        self.step_start = 0.0

    def attach(self, trainer: Any) -> None:
        """Wrap the trainer's phase methods (on the instance: TRL's class is left as it is)."""
        for phase, method in self.timed.items():
            setattr(trainer, method, self._timed(phase, getattr(trainer, method)))

    def _timed(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.in_step:
                return method(*args, **kwargs)
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.totals[phase] += time.perf_counter() - start

        return run

    def on_step_begin(self, args, state, control, **kwargs):
        self.in_step, self.step_start = True, time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.totals["step"] += time.perf_counter() - self.step_start
        self.in_step, self.steps = False, self.steps + 1

    def split(self) -> dict[str, float]:
        """Seconds per step since the last call, by phase (empty before the first step)."""
        if not self.steps:
            return {}
        t, n = self.totals, self.steps
        other_prep = max(t["prepare"] - t["generation"] - t["rewards"], 0.0)
        out = {
            "time/generation_s": t["generation"] / n,
            "time/rewards_s": t["rewards"] / n,
            "time/scoring_s": other_prep / n,
            "time/backward_s": max(t["step"] - t["prepare"], 0.0) / n,
        }
        self.totals, self.steps = defaultdict(float), 0
        return {k: round(v, 3) for k, v in out.items()}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return  # evaluation logs: no training step to split
        add_to_log(state, logs, self.split())


def add_to_log(state: Any, logs: dict[str, Any], extra: dict[str, Any]) -> None:
    """Figures a callback adds to a log entry: in `logs`, for the loggers called after it, and in the
    copy the Trainer kept in `state.log_history` before the callbacks ran."""
    logs.update(extra)
    if state.log_history and state.log_history[-1].get("step") == state.global_step:
        state.log_history[-1].update(extra)
