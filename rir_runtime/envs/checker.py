"""Environment contract checker, in the spirit of Gymnasium's `env_checker`.

Any environment, built-in or user-written, can be run through `check_env`. Each `check_*`
function tests one promise of the contract and, when it fails, says what the probable bug is.
The rollback check is ours: checkpoint, act, restore, act again, compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rir_runtime.envs.base import Env, Observation, StepResult, TaskSpec
from rir_runtime.errors import RIRError


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    message: str


class CheckFailed(AssertionError):
    """A contract violation; the message names the probable bug."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def walk(env: Env, n: int) -> list[tuple[str, StepResult]]:
    """Take up to `n` deterministic actions: the expert's next action when there is one, else a
    fixed pick among admissible actions. Stops early at the end of the episode."""
    taken: list[tuple[str, StepResult]] = []
    for i in range(n):
        plan = env.expert_actions()
        options = env.admissible_actions()
        if plan:
            action = plan[0]
        elif options:
            action = options[(7 * i) % len(options)]
        else:
            break
        result = env.step(action)
        taken.append((action, result))
        if result.done:
            break
    return taken


# --- individual checks -------------------------------------------------------------------
def check_reset(env: Env, task: TaskSpec) -> None:
    obs = env.reset(task)
    _require(isinstance(obs, Observation), f"reset() must return Observation, got {type(obs).__name__}")
    _require(isinstance(obs.text, str) and bool(obs.text), "reset() returned an empty observation text")
    _require(isinstance(obs.objective, str) and bool(obs.objective), "reset() returned no task objective")


def check_step_types(env: Env, task: TaskSpec) -> None:
    env.reset(task)
    actions = env.admissible_actions()
    _require(
        isinstance(actions, list) and all(isinstance(a, str) for a in actions),
        "admissible_actions() must return a list of str",
    )
    _require(actions == env.admissible_actions(), "admissible_actions() is not deterministic (order or content)")
    _require(len(actions) > 0, "admissible_actions() is empty right after reset")
    result = env.step(actions[0])
    _require(isinstance(result, StepResult), f"step() must return StepResult, got {type(result).__name__}")
    for name in ("done", "won", "lost"):
        _require(isinstance(getattr(result, name), bool), f"StepResult.{name} must be bool")
    _require(isinstance(result.observation, str), "StepResult.observation must be str")
    _require(isinstance(result.score, (int, float)), "StepResult.score must be a number")
    _require(not (result.won and result.lost), "a step cannot be both won and lost")
    _require(not (result.won or result.lost) or result.done, "won/lost steps must also set done")


def check_reset_determinism(env: Env, task: TaskSpec, depth: int = 6) -> None:
    first = env.reset(task)
    run1 = walk(env, depth)
    second = env.reset(task)
    _require(
        first.text == second.text,
        "two resets of the same task gave different observations: "
        "the engine is seeded from something other than the task (time, global RNG?)",
    )
    for action, result in run1:
        again = env.step(action)
        _require(
            again.observation == result.observation and again.score == result.score,
            f"replaying '{action}' after reset gave a different observation; replay-based restore "
            "cannot be verified on this engine",
        )


def check_rollback(env: Env, task: TaskSpec, before: int = 3, after: int = 3) -> None:
    env.reset(task)
    walk(env, before)
    snap = env.checkpoint()
    suffix = walk(env, after)
    _require(len(suffix) > 0, "the episode ended before the rollback check could act after the checkpoint")
    for attempt in range(2):  # a snapshot must be restorable more than once
        obs = env.restore(snap)
        _require(
            obs.text == snap.observation,
            f"restore #{attempt + 1} returned an observation different from the checkpoint's",
        )
        _require(
            obs.score == snap.score,
            f"restore #{attempt + 1} did not bring the score back ({obs.score} != {snap.score})",
        )
        for action, result in suffix:
            again = env.step(action)
            _require(
                again.observation == result.observation,
                f"after restore #{attempt + 1}, '{action}' behaved differently than before the "
                "rollback: the snapshot misses part of the state",
            )


def check_expert(env: Env, task: TaskSpec) -> None:
    if not env.has_expert:
        return
    env.reset(task)
    plan = env.expert_actions()
    _require(
        isinstance(plan, list) and bool(plan) and all(isinstance(a, str) for a in plan),
        "expert_actions() must return a non-empty list of str right after reset",
    )


CHECKS: dict[str, Callable[[Env, TaskSpec], None]] = {
    "reset": check_reset,
    "step-types": check_step_types,
    "reset-determinism": check_reset_determinism,
    "rollback": check_rollback,
    "expert": check_expert,
}


def check_env(env: Env, task: TaskSpec) -> list[CheckResult]:
    """Run every check on one task; a check that raises reports failure with its message."""
    results = []
    for name, check in CHECKS.items():
        try:
            check(env, task)
            results.append(CheckResult(name, True, "ok"))
        except (CheckFailed, RIRError) as err:
            results.append(CheckResult(name, False, str(err)))
        except Exception as err:  # a user-written env may raise anything: report it, keep checking
            results.append(CheckResult(name, False, f"{type(err).__name__}: {err}"))
    return results
