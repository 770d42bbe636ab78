"""Shared fixtures. Caches go to a per-session temp folder unless RIR_CACHE_DIR is already set
(the Makefile points it at .cache/rir so converted models and generated games are reused)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not os.environ.get("RIR_CACHE_DIR"):
        os.environ["RIR_CACHE_DIR"] = str(tmp_path_factory.mktemp("rir-cache"))


@pytest.fixture
def workshop() -> WorkshopEnv:
    return WorkshopEnv()


@pytest.fixture
def task3() -> TaskSpec:
    return TaskSpec("builtin", "workshop-3", "dev", 0)


@pytest.fixture(scope="module")
def value_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Agent-valued workshop data (rollouts of the error-injected expert, labelled by its continuations):
    the value and value-GRPO tests train on it."""
    from data_gen.build import build
    from data_gen.build_config import BuildConfig
    from data_gen.rollout import RolloutConfig, rollout

    root = tmp_path_factory.mktemp("value")
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], split="train", variations="0-11", methods=["rir"],
                          budget_agent="40", budget_rollback=1, review_interval=8, error_rate=0.3,
                          out=str(root / "rollout")))  # fmt: skip
    build(BuildConfig(rollouts=[str(root / "rollout")], out=str(root / "data"), label_value="agent-lesson",
                      bisect=False, value_rollouts=1, value_max_steps=40))  # fmt: skip
    return root / "data"
