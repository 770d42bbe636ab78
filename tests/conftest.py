"""Shared fixtures. Caches go to a per-session temp folder unless RIR_CACHE_DIR is already set
(the Makefile points it at .cache/rir so converted models and generated games are reused)."""

from __future__ import annotations

import os

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
