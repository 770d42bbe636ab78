"""A When learned without a language model: logistic regression on what the review prompt states.

The controller prompt spells out the trajectory's signals (steps taken, steps since the score last
rose, repeated actions, error replies, the score, the trigger) and names the benchmark. A random-weight
network learns the When from those rows nearly as well as a pretrained one, so the bar a tuned When
has to clear is not only ranking by step index but a ten-parameter model fitted on the same train
rows. `feature_reference` fits it on the train split and ranks the scored rows with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from data_gen.scoring.metrics import auroc, auroc_ci, auroc_within
from rir_runtime.prompts import DecisionContext
from rir_runtime.signals import RECENT_WINDOW, is_error_reply, steps_since_progress


def review_features(row: dict[str, Any]) -> dict[str, float]:
    """The facts a review prompt states, as numbers; the benchmark and trigger as indicators."""
    ctx = DecisionContext.from_json(row["meta"]["context"])
    h, recent = ctx.history, ctx.history[-RECENT_WINDOW:]
    return {
        "steps": float(len(h)),
        "steps_since_progress": float(steps_since_progress(h)),
        "most_repeated_recent_action": float(max(Counter(s.action for s in recent).values(), default=0)),
        "recent_error_replies": float(sum(is_error_reply(s.observation) for s in recent)),
        "score_fraction": ctx.score / ctx.max_score if ctx.max_score else 0.0,
        "lost": float(bool(h) and h[-1].lost),
        f"trigger={ctx.trigger}": 1.0,
        f"env={row['meta'].get('env', '')}": 1.0,
    }


def _matrix(rows: Sequence[dict[str, float]], names: list[str]) -> np.ndarray:
    return np.array([[r.get(n, 0.0) for n in names] for r in rows], dtype=float)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 50) -> np.ndarray:
    """Class-balanced, L2-regularised logistic regression by Newton's method; returns the weights
    with the intercept last. Balanced, as the controller's training is: "recover" is the rare class."""
    n = len(y)
    positives = max(int(y.sum()), 1)
    weight = np.where(y == 1, n / (2 * positives), n / (2 * max(n - positives, 1)))
    design = np.hstack([x, np.ones((n, 1))])
    penalty = np.eye(design.shape[1]) * l2
    penalty[-1, -1] = 0.0  # the intercept is not shrunk
    beta = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-design @ beta))
        gradient = design.T @ (weight * (p - y)) + penalty @ beta
        hessian = design.T @ (design * (weight * p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta


def feature_reference(train: list[dict[str, Any]], scored: list[dict[str, Any]]) -> dict[str, Any]:
    """AUROC of the feature model fitted on `train` review rows, ranking the `scored` ones, with its
    bootstrap 95% interval over the scored rows (None where either side lacks one of the two answers)."""
    y_train = np.array([r["meta"]["label"] == "recover" for r in train], dtype=float)
    labels = [r["meta"]["label"] == "recover" for r in scored]
    out: dict[str, Any] = {
        "feature_train_rows": len(train),
        "review_auroc_by_features": None,
        "review_auroc_by_features_ci95": None,
        "review_auroc_by_features_within_env": None,
    }
    if not scored or len(set(y_train.tolist())) < 2:
        return out  # nothing to rank, or a train split without both answers (or none at all)
    train_features = [review_features(r) for r in train]
    names = sorted({name for f in train_features for name in f})
    x = _matrix(train_features, names)
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-9
    beta = fit_logistic((x - mean) / scale, y_train)
    z = (_matrix([review_features(r) for r in scored], names) - mean) / scale
    scores = list(z @ beta[:-1] + beta[-1])
    envs = [str(r["meta"].get("env", "")) for r in scored]
    out["review_auroc_by_features"] = auroc(labels, scores)
    out["review_auroc_by_features_ci95"] = auroc_ci(labels, scores)
    out["review_auroc_by_features_within_env"] = auroc_within(labels, scores, envs)
    return out
