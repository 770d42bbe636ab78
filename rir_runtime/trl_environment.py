"""Snapshot and branch for TRL: any environment of this runtime (native snapshots or verified replay)
served to `GRPOTrainer(environment_factory=...)`.

TRL's environment API gives each rollout its own instance, calls `reset(**row)` with the dataset row's
fields, exposes the public methods as the model's tools, and scores the rollout with `get_reward()`.
`CheckpointEnvironment` adds what agent-RL frameworks lack: `reset` can start a rollout at a recorded
decision point (a task and an action prefix, restored exactly: replayed and verified, or from a native
snapshot), and the model gets a `rollback` tool that restores any checkpoint of its own rollout. So the
`num_generations` rollouts of a group start from one restored state, and a trained agent can learn to
go back. Nothing here is specific to this project's controllers: bring an `Env` (`rir_runtime.envs`:
`reset`, `step`, `checkpoint`, `restore`) and a dataset whose rows name the task and the prefix.

    from trl import GRPOTrainer
    trainer = GRPOTrainer(model=..., train_dataset=rows,  # rows: prompt, env, task, split, variation, actions
                          environment_factory=CheckpointEnvironment, reward_funcs=[...])
"""

from __future__ import annotations

import json
from typing import Any

from rir_runtime.envs import Env, TaskSpec, make_env
from rir_runtime.envs.checkpoints import CheckpointStore, Step
from rir_runtime.errors import RestoreError, UserInputError


class CheckpointEnvironment:
    """One rollout's environment: restored at a decision point, stepped by the model's tool calls, able
    to roll back to any of its checkpoints, and scored by whether the task was won."""

    def __init__(self, env: Env | None = None) -> None:
        self._env, self._own = env, env is None
        self.store = CheckpointStore()
        self.history: tuple[Step, ...] = ()
        self.won = self.done = False

    def reset(
        self,
        env: str = "builtin",
        task: str = "",
        split: str = "train",
        variation: int = 0,
        actions: Any = (),
        **_: Any,
    ) -> str:
        """Start the rollout at the row's decision point: the task reset, then the action prefix replayed
        and verified (each replayed step's reply must be the environment's, or the point is refused)."""
        if not task:
            raise UserInputError("a CheckpointEnvironment row needs `task` (and `env`, `split`, `variation`)")
        if self._env is None or self._own and self._env.name != env:
            self._env = make_env(env)
        prefix = json.loads(actions) if isinstance(actions, str) else list(actions)
        obs = self._env.reset(TaskSpec(env, task, split, int(variation)))  # type: ignore[arg-type]
        self.store, self.history, self.won, self.done = CheckpointStore(), (), False, False
        self.store.save(self._env, ())
        text = obs.text
        for action in prefix:
            text = self._step(str(action))
            if self.done:
                raise RestoreError(f"the prefix of {task} ends the episode at '{action}': no decision point after it")
        return text

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: The action, as the environment's text interface takes it (e.g. "take apple").

        Returns:
            What the environment answers, with the score.
        """
        if self.done:
            return "The episode is over."
        return self._step(action)

    def rollback(self, checkpoint: int) -> str:
        """Go back to an earlier checkpoint of this rollout: the world is restored exactly.

        Args:
            checkpoint: The checkpoint to restore: the number of actions taken before it (0 is the start).

        Returns:
            The observation at that checkpoint, or why it cannot be restored.
        """
        assert self._env is not None
        reason = self.store.reason_not_admissible(int(checkpoint))
        if reason:
            return f"cannot roll back: {reason}"
        restored, obs = self.store.restore(self._env, int(checkpoint))
        self.history, self.won, self.done = restored.history, False, False
        return obs.text

    def get_reward(self) -> float:
        """1.0 when the rollout won the task, else 0.0."""
        return 1.0 if self.won else 0.0

    def _step(self, action: str) -> str:
        assert self._env is not None
        result = self._env.step(action)
        step = Step(len(self.history), action, result.observation, result.score, result.won, result.lost)
        self.store.record_step(step, result)
        self.history += (step,)
        self.won, self.done = result.won, result.done
        if not result.done:
            self.store.save(self._env, self.history)
        return f"{result.observation} (score {result.score:g})"
