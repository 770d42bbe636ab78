"""The feature reference: a logistic regression on the prompt's signals, fitted on train reviews."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict

from eval.controller_eval import ControllerEvalConfig, evaluate_controllers, markdown
from eval.when_features import feature_reference, fit_logistic, review_features
from rir_runtime.envs.checkpoints import Step
from rir_runtime.prompts import DecisionContext


def review_row(actions: list[str], label: str, env: str = "builtin", trigger: str = "schedule") -> dict[str, Any]:
    history = tuple(Step(i, a, "Nothing happens." if a == "push wall" else "ok", 0.0) for i, a in enumerate(actions))
    ctx = DecisionContext("t", "goal", "", history, "ok", 0.0, trigger=trigger, max_score=100.0)
    return {"meta": {"context": ctx.to_json(), "label": label, "env": env, "step": len(actions)}}


def looping_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Reviews at random steps; "recover" exactly where the agent repeats one action three times in a
    row (so the step index alone cannot tell them apart)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(4, 12)
        actions = [f"go {rng.choice('nsewud')}{i}" for i in range(length)]
        loops = rng.random() < 0.3
        if loops:
            actions[-3:] = ["push wall"] * 3
        rows.append(review_row(actions, "recover" if loops else "continue"))
    return rows


def test_features_read_the_signals_the_prompt_states() -> None:
    f = review_features(review_row(["open door", "push wall", "push wall", "push wall"], "recover", trigger="agent"))
    assert f["steps"] == 4 and f["most_repeated_recent_action"] == 3 and f["recent_error_replies"] == 3
    assert f["trigger=agent"] == 1.0 and f["env=builtin"] == 1.0 and f["lost"] == 0.0


def test_the_fitted_model_ranks_held_out_loops_where_the_step_index_cannot() -> None:
    reference = feature_reference(looping_rows(200, seed=0), looping_rows(60, seed=1))
    assert reference["feature_train_rows"] == 200
    assert reference["review_auroc_by_features"] > 0.95
    text = markdown([{"controller": "heuristic", "review_auroc": 0.5}], "validation", None, reference)
    assert "fitted on 200 train reviews, ranks them at AUROC" in text


def test_a_train_split_with_one_answer_gives_no_reference() -> None:
    only_continue = [r for r in looping_rows(50, seed=2) if r["meta"]["label"] == "continue"]
    assert feature_reference(only_continue, looping_rows(20, seed=3))["review_auroc_by_features"] is None
    assert feature_reference([], looping_rows(20, seed=3))["review_auroc_by_features"] is None  # no train split


def test_balanced_logistic_regression_separates_a_rare_class() -> None:
    x = np.array([[0.0], [0.1], [0.2], [0.3], [0.4], [0.5], [0.6], [2.0]])
    y = np.array([0, 0, 0, 0, 0, 0, 0, 1], dtype=float)
    beta = fit_logistic(x, y, l2=0.1)
    assert beta[0] > 0 and x[-1, 0] * beta[0] + beta[1] > 0 > x[0, 0] * beta[0] + beta[1]


def test_eval_controller_writes_the_reference_except_on_the_split_it_is_fitted_on(tmp_path: Path) -> None:
    """Scored on validation rows, the report carries the feature model's AUROC; scored on the train
    split it would rank the rows it was fitted on, so no figure is written."""

    def rows(n: int, seed: int) -> list[dict[str, Any]]:
        out = looping_rows(n, seed)
        for r in out:
            r["meta"].update(decision="review", source_run="runs/x/rollout-builtin")
            r["prompt"] = [{"role": "user", "content": "review"}]
            r["completion"] = [{"role": "assistant", "content": json.dumps({"decision": r["meta"]["label"]})}]
        return out

    DatasetDict({"train": Dataset.from_list(rows(80, 0)), "validation": Dataset.from_list(rows(30, 1))}).save_to_disk(
        str(tmp_path / "data" / "review_sft")
    )
    for split, expect_figure in (("validation", True), ("train", False)):
        cfg = ControllerEvalConfig(data=str(tmp_path / "data"), split=split, out=str(tmp_path / split))
        evaluate_controllers(cfg)
        reference = json.loads((tmp_path / split / "controller_eval.json").read_text())["reference"]
        assert (reference["review_auroc_by_features"] is not None) is expect_figure
