"""The recover-vs-continue threshold of a controller adapter, calibrated on held-out review rows.

A ranked review compares log p(recover) with log p(continue). Trained on skewed labels, an adapter's
margin sits far on one side (it never, or always, says "recover"), yet it may still order the rows
well. The threshold that maximises balanced accuracy on the `calibration` split's review rows (task
variations held out from training and from the validation rows that offline scores read) goes
into the adapter card (`review_threshold`), and `tuned:<dir>` controllers decide with it.

A threshold fitted on a handful of rows is noise: with two "recover" rows it lands wherever those two
margins happen to fall (a 9-row split once set +1.785, and the adapter never recovered online). Below
`min_per_label` rows of either label the card keeps 0, the adapter's own argmax, and says why. So
it does when the margins may rank the rows no better than chance (the AUROC's bootstrap 95% interval
reaches 0.5): the best cut on such margins is whichever extreme the rows happen to favour (the
demo's adapter, at AUROC 0.264 on 48 rows, was set to say "recover" on every review; an online-GRPO
value adapter, at 0.513 on 120 rows, to recover wherever a restore scored above -8.3).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from data_gen.scoring.answers import share_by_source
from data_gen.scoring.metrics import auroc_ci, best_threshold, binary_quality
from rir_runtime.errors import UserInputError
from rir_runtime.llm.card import card_as_written, update_card

CALIBRATION = "calibration"  # the review datasets' split for this, disjoint from the validation rows
MIN_ROWS_PER_LABEL = 5  # fewer "recover" (or "continue") rows than this: no threshold is fitted


def review_rows(data: str, split: str, max_rows: int) -> tuple[str, list[dict[str, Any]]]:
    """(the split used, the `meta` of up to `max_rows` of its review rows that carry a context): the
    `calibration` split where the data has one, else `split`, with a warning that the threshold
    is then fitted on rows that offline scores will also read (data built before that split).
    The cap is shared equally by the rollout folders the rows come from: rows come in blocks by
    folder, and the first 120 of the reference recipe's 259 were all workshop reviews, so the
    threshold served to the agent had never seen one of the agent's own reviews."""
    from datasets import load_from_disk

    folder = Path(data) / "review_sft" if (Path(data) / "review_sft").is_dir() else Path(data)
    dataset = load_from_disk(str(folder))
    if CALIBRATION in dataset:
        split = CALIBRATION
    elif split in dataset:
        print(
            f"warning: {folder} has no '{CALIBRATION}' split; calibrating on '{split}', whose rows offline "
            "scores read too (rebuild the data with `rir build-data` for a disjoint calibration split)",
            file=sys.stderr,
        )
    else:
        raise UserInputError(f"{folder} has no '{split}' split to calibrate on: rebuild it with `rir build-data`")
    metas = [m for m in dataset[split]["meta"] if m.get("context") and m.get("label") in ("recover", "continue")]
    return split, [metas[i] for i in share_by_source(metas, max_rows)]


def review_margins(adapter_dir: str, metas: list[dict[str, Any]]) -> list[float]:
    """The adapter's review margin on each row's situation: log p(recover) - log p(continue) for a
    generative adapter, the best recovery's score over going on's for a value adapter."""
    from rir_runtime.controllers import Controller, PromptedController, card_prompt_tokens
    from rir_runtime.prompts import DecisionContext

    controller: Controller
    if card_as_written(adapter_dir).get("kind") == "value":
        from rir_runtime.controllers.value import ValueController
        from rir_runtime.llm.value import load_value_scorer

        controller = ValueController(load_value_scorer(adapter_dir), name="calibration", margin=0.0)
    else:
        from rir_runtime.llm.tuned import load_tuned_backend

        backend = load_tuned_backend(adapter_dir)  # checks and keeps the card: its prompt budget is the served one
        controller = PromptedController(
            backend, name="calibration", max_prompt_tokens=card_prompt_tokens(backend.card), review_threshold=0.0
        )
    return [float(controller.review(DecisionContext.from_json(m["context"])).meta["margin"]) for m in metas]


def calibrate_review(
    adapter_dir: str,
    data: str,
    split: str = "validation",
    max_rows: int = 200,
    min_per_label: int = MIN_ROWS_PER_LABEL,
) -> dict[str, Any]:
    """Write `review_threshold` (and how it was found) into the adapter card; returns the record."""
    split, metas = review_rows(data, split, max_rows)
    labels = [m["label"] == "recover" for m in metas]
    fewest = min(sum(labels), len(labels) - sum(labels))
    if fewest < max(1, min_per_label):  # with one label (or none) there is no threshold to fit at all
        reason = (
            f"{len(labels)} {split} review rows, {sum(labels)} of them recover: fewer than {min_per_label} of a "
            "label, so the threshold stays 0 (build data with more task variations to calibrate)"
        )
        return keep_zero(adapter_dir, reason, split, metas)
    margins = review_margins(adapter_dir, metas)
    at_zero = binary_quality(labels, [m > 0 for m in margins], margins)
    ranking = at_zero.auroc or 0.0  # both labels are present, so it is defined
    interval = auroc_ci(labels, margins) or [0.0, 1.0]
    if interval[0] <= 0.5:  # the margin may order the rows no better than a coin: any cut on it fits noise
        reason = (
            f"the margins rank the {len(labels)} {split} review rows no better than chance (AUROC "
            f"{ranking:.3f}, 95% interval [{interval[0]:.3f}, {interval[1]:.3f}] reaches 0.5), so the "
            "threshold stays 0: a cut on them would fit noise"
        )
        return keep_zero(adapter_dir, reason, split, metas, auroc=ranking, auroc_low=interval[0])
    threshold = best_threshold(labels, margins)
    tuned = binary_quality(labels, [m > threshold for m in margins], margins)
    record = {
        "review_threshold": threshold,
        "review_calibration": {
            **row_counts(split, metas),
            "auroc": tuned.auroc,
            "balanced_accuracy_at_0": at_zero.balanced_accuracy,
            "balanced_accuracy_at_threshold": tuned.balanced_accuracy,
            "f1_at_threshold": tuned.f1,
        },
    }
    update_card(adapter_dir, record)
    print(
        f"review threshold {threshold:+.3f}: balanced accuracy {at_zero.balanced_accuracy:.1%} at 0 -> "
        f"{tuned.balanced_accuracy:.1%} on {len(labels)} {split} rows (AUROC {tuned.auroc:.3f})",
        file=sys.stderr,
    )
    return record


def row_counts(split: str, metas: list[dict[str, Any]]) -> dict[str, Any]:
    """What a calibration record says of its rows: the split, how many, how many "recover", and how
    many came from each rollout folder (by folder name)."""
    return {
        "split": split,
        "rows": len(metas),
        "recover_rows": sum(m["label"] == "recover" for m in metas),
        "rows_by_source": dict(Counter(Path(str(m.get("source_run", ""))).name for m in metas)),
    }


def keep_zero(adapter_dir: str, reason: str, split: str, metas: list[dict[str, Any]], **found: float) -> dict[str, Any]:
    """Fit no threshold: the card keeps 0 (the adapter's own argmax) and says why, with what was found."""
    print(f"warning: calibration skipped: {reason}", file=sys.stderr)
    skipped = {"skipped": reason, **row_counts(split, metas), **found}
    return update_card(adapter_dir, {"review_threshold": 0.0, "review_calibration": skipped})
