"""What both GRPO trainers share (the generative controller's in `train/grpo.py`, the value adapter's in
`train/value_grpo.py`): the warning when no group of sampled answers has signal, the online reward's
log, and what the adapter card says of the rewards."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class NoSignalWarning(TrainerCallback):
    """Warns once when GRPO has nothing to learn from: in `patience` logged steps in a row, every
    group of sampled answers got one reward (TRL's `frac_reward_zero_std` = 1), so every advantage,
    and the gradient, is 0. It happens when the starting adapter answers one way at the sampling
    temperature (a review adapter that always says "continue")."""

    def __init__(self, patience: int = 3) -> None:
        self.patience = patience
        self.flat_steps = 0
        self.warned = False

    def message(self, temperature: float, generations: int) -> str:
        return (
            f"GRPO is not learning: in the last {self.flat_steps} logged steps every group of "
            f"{generations} answers sampled at temperature {temperature} got the same reward "
            "(frac_reward_zero_std = 1), so every advantage is 0. The starting adapter answers one way; "
            "raise --temperature or --num_generations, or start from an adapter whose sampled answers "
            "vary (`rir eval-controller` scores its decisions and their rewards)"
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        flat = (logs or {}).get("frac_reward_zero_std")
        if flat is None:
            return
        self.flat_steps = self.flat_steps + 1 if float(flat) >= 1.0 else 0
        if self.flat_steps >= self.patience and not self.warned:
            self.warned = True
            if state.is_world_process_zero:  # every process logs the same gathered metrics
                print(f"warning: {self.message(args.temperature, args.num_generations)}", flush=True)


def online_reward(script_args: Any) -> Any:
    """With `--reward online`, the one `OnlineReward` that plays every sampled decision out; else None."""
    if script_args.reward != "online":
        return None
    from train.common.online_rewards import OnlineReward

    return OnlineReward(
        script_args.rollback_cost,
        script_args.call_cost,
        script_args.reward_workers,
        script_args.reward_executor,
        script_args.reward_draws,
    )


def online_logs(rewards: list[Any]) -> list[Any]:
    """The callback that logs an online reward's restores and seconds (none for table rewards)."""
    from train.common.online_rewards import OnlineReward, OnlineRewardLog

    return [OnlineRewardLog(r) for r in rewards if isinstance(r, OnlineReward)]


def reward_settings(script_args: Any) -> dict[str, Any]:
    """What the card says of the rewards the adapter was trained on."""
    if script_args.reward == "online":
        return {
            "reward": "online",
            "rollback_cost": script_args.rollback_cost,
            "call_cost": script_args.call_cost,
            "draws": script_args.reward_draws,
        }
    return {"reward": "table", "locate_lateness_penalty": script_args.lateness_penalty}
