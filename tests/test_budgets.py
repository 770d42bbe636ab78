"""Agent budgets: absolute or relative to the task's expert path, resolved per episode and reported."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval.harness import EvalConfig, evaluate
from rir_runtime.budgets import AgentBudget, Budgets
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.errors import UserInputError
from rir_runtime.trace import read_records


@pytest.mark.parametrize(("spec", "text", "steps", "calls"), [("60", "60", None, 60), ("1.5x", "1.5x", 9, 14)])
def test_budgets_parse_print_and_resolve(spec: str, text: str, steps: int | None, calls: int) -> None:
    budget = AgentBudget.parse(spec)
    assert str(budget) == text and budget.resolve(steps) == calls
    assert Budgets(agent=budget).agent_calls(steps) == calls


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", "two"])
def test_a_malformed_budget_names_both_forms(bad: str) -> None:
    with pytest.raises(UserInputError, match="count of model calls|whole number"):
        AgentBudget.parse(bad)


def test_a_relative_budget_without_an_expert_plan_is_an_error() -> None:
    with pytest.raises(UserInputError, match="no expert plan"):
        AgentBudget.parse("2x").resolve(None)


def test_eval_resolves_a_relative_budget_per_task_and_reports_both(tmp_path: Path) -> None:
    cfg = EvalConfig(
        env="builtin", tasks=["workshop-3", "workshop-4"], variations="0-2", methods=["react", "rir"],
        budget_agent="1.5x", out=str(tmp_path),
    )  # fmt: skip
    evaluate(cfg)
    records = read_records(tmp_path / "episodes.jsonl")
    env = WorkshopEnv()
    for r in records:
        env.reset(TaskSpec(r.env, r.task, r.split, r.variation))
        assert r.expert_steps == len(env.expert_actions())
        assert r.budget_agent == math.ceil(1.5 * r.expert_steps) and r.budget_agent_spec == "1.5x"
        assert r.agent_calls <= r.budget_agent and "/b1.5xr5c-/" in r.episode_id
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["budget_agent"] == "1.5x"
    by_method = {m: [r.budget_agent for r in records if r.method_key == m] for m in summary["methods"]}
    for name, s in summary["methods"].items():
        assert s["budget_agent"] == pytest.approx(sum(by_method[name]) / len(by_method[name]), abs=1e-3)
    assert summary["paired"] and summary["paired"][0]["episodes"] == 6  # relative budgets still pair
