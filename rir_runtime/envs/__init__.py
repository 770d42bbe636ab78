"""Environment registry: the environment names the CLI accepts resolve to `Env` classes, imported lazily.

Lazy imports keep `rir --help` fast and let the built-in environment work without Java.
"""

from __future__ import annotations

import importlib

from rir_runtime.envs.base import SPLITS, Env, Observation, Snapshot, StepResult, TaskSpec, as_split
from rir_runtime.errors import UnknownNameError, UserInputError

# name -> "module:Class"
ENV_CLASSES: dict[str, str] = {
    "builtin": "rir_runtime.envs.builtin:WorkshopEnv",
    "scienceworld": "rir_runtime.envs.scienceworld_env:ScienceWorldEnv",
    "textworld-cooking": "rir_runtime.envs.textworld_env:TextWorldCookingEnv",
    "shopdb": "rir_runtime.envs.shopdb:ShopDBEnv",
}

__all__ = [
    "ENV_CLASSES",
    "SPLITS",
    "Env",
    "Observation",
    "Snapshot",
    "StepResult",
    "TaskSpec",
    "as_split",
    "env_class",
    "make_env",
    "parse_variations",
    "resolve_tasks",
]


def env_class(name: str) -> type[Env]:
    """The `Env` subclass registered under `name`."""
    if name not in ENV_CLASSES:
        raise UnknownNameError("environment", name, list(ENV_CLASSES))
    module, cls = ENV_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_env(name: str, **kwargs: object) -> Env:
    """Instantiate the environment registered under `name`."""
    return env_class(name)(**kwargs)


def parse_variations(text: str | None) -> list[int] | None:
    """Parse `0-9`, `0,3,5` or `0-2,7` into a sorted list; None means all variations."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    out: set[int] = set()
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError
                out.update(range(int(lo), int(hi) + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise UserInputError(
            f"cannot parse variations '{text}': use a range like 0-9, a list like 0,3,5, or both (0-2,7)"
        ) from None
    return sorted(out)


def resolve_tasks(env: Env, tasks: list[str] | None, split: str, variations: list[int] | None) -> list[TaskSpec]:
    """Validate a selection and expand it into `TaskSpec`s, with one clear error for bad input."""
    the_split = as_split(split)
    names = type(env).task_names()
    chosen = tasks or names
    if not chosen:
        raise UserInputError("the task list is empty: pass --tasks with at least one task name")
    specs: list[TaskSpec] = []
    for task in chosen:
        if task not in names:
            raise UnknownNameError(f"{env.name} task", task, names)
        n = env.num_variations(task, the_split)
        wanted = variations if variations is not None else list(range(n))
        for v in wanted:
            if not 0 <= v < n:
                raise UserInputError(
                    f"variation {v} does not exist for {env.name} task '{task}' in split '{split}' "
                    f"(it has variations 0-{n - 1}); pick --variations within that range"
                )
            specs.append(TaskSpec(env=env.name, task=task, split=the_split, variation=v))
    return specs
