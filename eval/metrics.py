"""Decision-quality metrics for skewed labels: balanced accuracy, F1, AUROC, and the majority-class
baseline they must beat. Accuracy alone rewards a controller that always gives the majority answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


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
