"""The class of a row's answer, and what evens the classes out: training resamples rows (SFT, DPO) or
weights rewards (GRPO) by it, and capped scoring and calibration share their rows by it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rir_runtime.decisions import DecisionKind

LOCATE_KINDS: tuple[DecisionKind, ...] = ("locate_coarse", "locate_fine")


def answer_class(meta: dict[str, Any]) -> str | None:
    """The class of a row's answer that balancing evens out: a review row's label ("recover" or
    "continue"); for a restore-point row (coarse or fine), "stay" when the restore label is the
    current checkpoint (recover without rolling back) else "step back"; None for other rows, hand-made
    rows without `meta.step`, and coarse rows built before `meta.restore` existed (a fine row still
    tells by its label)."""
    decision = meta.get("decision")
    if decision == "review":
        return meta.get("label")
    if decision not in ("locate_coarse", "locate_fine"):
        return None
    restore = meta.get("restore")
    if restore is None and decision == "locate_fine" and meta.get("label") is not None:
        restore = int(meta["label"])
    if restore is None or meta.get("step") is None:
        return None
    return "stay" if int(restore) == int(meta["step"]) else "step back"


def class_weights(labels: Sequence[str]) -> dict[str, float]:
    """n / (k * n_c) per class c (n rows, k classes): each class then carries the same total weight."""
    counts = Counter(labels)
    return {c: len(labels) / (len(counts) * n) for c, n in counts.items()}


def train_class_weights(metas: Sequence[dict[str, Any]], review: bool, locate: bool) -> dict[str, float]:
    """Inverse class frequencies (`answer_class`) in the training split's rows, per decision group
    balanced: review labels and/or restore points that stay or step back. GRPO balances by weighting
    rewards, where SFT and DPO resample rows."""
    weights: dict[str, float] = {}
    groups = ([("review",)] if review else []) + ([LOCATE_KINDS] if locate else [])
    for kinds in groups:
        classes = [c for m in metas if m["decision"] in kinds and (c := answer_class(m)) is not None]
        if classes:
            weights.update(class_weights(classes))
    return weights


def share_cap(keys: list[Any], n: int) -> list[int]:
    """Indices of at most `n` items shared equally by the groups their `keys` form (a group with
    fewer items gives up the rest of its share to the others), evenly spaced within each group and
    in their original order: a rare group is not left to one or two rows, nor a block to fill the cap."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    picked: list[int] = []
    left = n
    for k, group in enumerate(sorted(groups.values(), key=len)):  # small groups first: they give up their share
        take = min(len(group), left // (len(groups) - k))
        picked += spaced(group, take)
        left -= take
    return sorted(picked)


def share_by_source(metas: Sequence[dict[str, Any]], n: int) -> list[int]:
    """`share_cap` by the rollout folder a row came from (`meta.source_run`): rows come in blocks by
    folder and the workshop's outnumber the others' tenfold, so a plain cap would take one benchmark."""
    return share_cap([str(m.get("source_run", "")) for m in metas], n)


def spaced(items: list[Any], n: int) -> list[Any]:
    return [items[i * len(items) // n] for i in range(n)] if n < len(items) else items
