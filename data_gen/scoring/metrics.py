"""Decision-quality metrics for skewed labels: balanced accuracy, F1, AUROC, and the majority-class
baseline they must beat. Accuracy alone rewards a controller that always gives the majority answer.
Held-out sets are small (tens of reviews), so the figures that compare controllers also get percentile
bootstrap 95% intervals (`bootstrap_ci`): two controllers whose intervals overlap widely are not told apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class BinaryQuality:
    """How well predictions of one binary decision (e.g. "recover") match the labels."""

    rows: int
    positives: int  # rows whose label is the positive class
    accuracy: float
    balanced_accuracy: float  # the mean of the two classes' recalls: 0.5 for any constant answer
    precision: float
    recall: float
    f1: float
    auroc: float | None  # from the controller's scores; None when one class is absent
    majority_accuracy: float  # what always giving the majority answer scores
    majority_f1: float

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def binary_quality(labels: Sequence[bool], predictions: Sequence[bool], scores: Sequence[float]) -> BinaryQuality:
    """`scores` rank the rows by how positive the controller thinks they are (a log-odds margin, or
    the prediction itself for a controller without one)."""
    n = len(labels)
    if not n or not (len(predictions) == len(scores) == n):
        raise ValueError("labels, predictions and scores must be non-empty and of one length")
    tp = sum(y and p for y, p in zip(labels, predictions, strict=True))
    fp = sum(p and not y for y, p in zip(labels, predictions, strict=True))
    fn = sum(y and not p for y, p in zip(labels, predictions, strict=True))
    tn = n - tp - fp - fn
    pos, neg = tp + fn, tn + fp
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / pos if pos else 0.0
    specificity = tn / neg if neg else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    balanced = (recall + specificity) / 2 if pos and neg else (recall if pos else specificity)
    majority_positive = pos >= neg
    majority_precision = pos / n if majority_positive else 0.0
    majority_f1 = 2 * majority_precision / (majority_precision + 1) if majority_positive else 0.0
    return BinaryQuality(
        n, pos, (tp + tn) / n, balanced, precision, recall, f1, auroc(labels, scores),
        max(pos, neg) / n, majority_f1,
    )  # fmt: skip


def auroc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    """The chance that a random positive row scores above a random negative one (ties count half):
    the Mann-Whitney U statistic over n_pos * n_neg."""
    positives = [s for y, s in zip(labels, scores, strict=True) if y]
    negatives = [s for y, s in zip(labels, scores, strict=True) if not y]
    if not positives or not negatives:
        return None
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu(positives, negatives, alternative="two-sided").statistic
    return float(u) / (len(positives) * len(negatives))


def auroc_within(labels: Sequence[bool], scores: Sequence[float], groups: Sequence[str]) -> float | None:
    """AUROC over the positive-negative pairs of one group only (e.g. one benchmark): a score whose
    level differs by group (labels of two benchmarks mean different things) cannot buy ranking
    quality here, as it can in the pooled AUROC. Groups weigh by their number of pairs."""
    correct = pairs = 0.0
    for group in sorted(set(groups)):
        mine = [(y, s) for y, s, g in zip(labels, scores, groups, strict=True) if g == group]
        n = sum(y for y, _ in mine) * sum(not y for y, _ in mine)
        value = auroc([y for y, _ in mine], [s for _, s in mine])
        if value is not None:
            correct, pairs = correct + value * n, pairs + n
    return correct / pairs if pairs else None


def best_threshold(labels: Sequence[bool], scores: Sequence[float]) -> float:
    """The score threshold (predict positive above it) with the highest balanced accuracy; midpoints
    between neighbouring scores, so the threshold generalises rather than sitting on one row."""
    values = sorted(set(scores))
    cuts = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)] + [values[-1] + 1.0]

    def balanced(cut: float) -> float:
        predictions = [s > cut for s in scores]
        return binary_quality(labels, predictions, scores).balanced_accuracy

    return max(cuts, key=lambda c: (balanced(c), -abs(c)))


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0  # fixed: a rerun, and every controller scored on the same rows, draws the same resamples

Interval = list[float]  # [lo, hi], a JSON pair


def bootstrap_ci(
    statistic: Callable[[np.ndarray], np.ndarray],
    n: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval | None:
    """Percentile bootstrap 95% interval of a statistic over `n` rows. `statistic` maps the row indices
    of every resample (one row of the array each) to one value per resample, NaN where it is undefined
    (a resample with one class only), which is left out. On 40 rows an AUROC is uncertain by about
    +-0.14, so a point estimate alone cannot say whether two controllers differ. None without rows or
    without one defined value."""
    if n < 1:
        return None
    idx = np.random.default_rng(seed).integers(0, n, (resamples, n))
    values = np.asarray(statistic(idx), dtype=float)
    values = values[~np.isnan(values)]
    if not values.size:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def mean_ci(hits: Sequence[float]) -> Interval | None:
    """The bootstrap interval of a mean (e.g. of 0/1 hits: an accuracy)."""
    x = np.asarray(hits, dtype=float)
    return bootstrap_ci(lambda idx: x[idx].mean(axis=1), len(x))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def auroc_ci(labels: Sequence[bool], scores: Sequence[float]) -> Interval | None:
    """The bootstrap interval of `auroc` (the Mann-Whitney U by average ranks: ties count half)."""
    from scipy.stats import rankdata

    y, s = np.asarray(labels, dtype=bool), np.asarray(scores, dtype=float)

    def statistic(idx: np.ndarray) -> np.ndarray:
        yy = y[idx]
        pos = yy.sum(axis=1)
        u = (rankdata(s[idx], axis=1) * yy).sum(axis=1) - pos * (pos + 1) / 2
        return _ratio(u, pos * (len(y) - pos))

    return bootstrap_ci(statistic, len(y))


def binary_intervals(
    labels: Sequence[bool], predictions: Sequence[bool], scores: Sequence[float]
) -> dict[str, Interval | None]:
    """Bootstrap 95% intervals of balanced accuracy, F1 and AUROC (`binary_quality`'s figures). A
    resample without both answers is left out (balanced accuracy and AUROC need both; F1 needs a
    "recover" row): on 3 "recover" rows of 23, one resample in 25 has none, and counting it would
    stretch a constant answer's 50% balanced accuracy to an interval reaching 100%."""
    y = np.asarray(labels, dtype=bool)
    p = np.asarray(predictions, dtype=bool)

    def balanced(idx: np.ndarray) -> np.ndarray:
        yy, pp = y[idx], p[idx]
        recall = _ratio((yy & pp).sum(axis=1), yy.sum(axis=1))
        specificity = _ratio((~yy & ~pp).sum(axis=1), (~yy).sum(axis=1))
        return (recall + specificity) / 2  # NaN where either class is absent

    def f1(idx: np.ndarray) -> np.ndarray:
        yy, pp = y[idx], p[idx]
        tp, positives = (yy & pp).sum(axis=1), yy.sum(axis=1)
        both = positives + (pp & ~yy).sum(axis=1) + tp  # 2tp + fp + fn
        return np.where(positives > 0, _ratio(2 * tp, both), np.nan)

    return {
        "balanced_accuracy_ci95": bootstrap_ci(balanced, len(y)),
        "f1_ci95": bootstrap_ci(f1, len(y)),
        "auroc_ci95": auroc_ci(labels, scores),
    }


def gain_calibration(claimed: Sequence[float], realised: Sequence[float], bins: int = 4) -> list[dict[str, float]]:
    """Does a claimed gain come true? The rows sorted by the gain a controller claims for its best
    recovery over going on, in `bins` groups of (nearly) equal size, each with its claimed range and
    mean and the mean gain realised in hindsight (the picked checkpoint's value less going on's). A
    calibrated controller's realised gain rises with its claim, and the margin it recovers above sits
    where the realised gain turns positive."""
    if len(claimed) != len(realised):
        raise ValueError("claimed and realised gains must be of one length")
    claims, gains = np.asarray(claimed, dtype=float), np.asarray(realised, dtype=float)
    out = []
    for group in np.array_split(np.argsort(claims, kind="stable"), min(bins, len(claims))):
        c, r = claims[group], gains[group]
        out.append(
            {
                "rows": len(group),
                "claimed_min": float(c.min()),
                "claimed_max": float(c.max()),
                "claimed_mean": float(c.mean()),
                "realised_mean": float(r.mean()),
            }
        )
    return out
