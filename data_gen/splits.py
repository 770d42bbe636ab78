"""Train and validation by task variation: one held-out set for all six datasets (training mixes them),
grown so that every dataset with two or more variations has both sides. The review datasets split
their held-out variations once more, into validation and `calibration`: the rows that set a tuned
controller's recover threshold are then never the rows its decisions are scored on."""

from __future__ import annotations

import sys
import zlib
from collections import Counter
from typing import Any


def variation_key(meta: dict[str, Any]) -> str:
    return f"{meta['env']}/{meta['task']}/{meta['split']}/{meta['variation']}"


def _rank(key: str) -> int:
    return zlib.crc32(key.encode())


def validation_variations(keys: set[str], fraction: float) -> set[str]:
    """A deterministic share of task variations held out: never on both sides of the split."""
    ranked = sorted(keys, key=_rank)
    n_val = max(1, round(fraction * len(ranked))) if len(ranked) > 1 else 0
    return set(ranked[:n_val])


def _both_sides(keys: set[str], held: set[str]) -> bool:
    return bool(keys & held) and bool(keys - held)


def _harmless(after: set[str], held: set[str], splittable: list[set[str]]) -> bool:
    """Moving from `held` to `after` leaves every dataset that had both sides with both sides."""
    return all(_both_sides(k, after) for k in splittable if _both_sides(k, held))


def held_out_variations(by_dataset: dict[str, set[str]], fraction: float) -> set[str]:
    """One held-out set of task variations for all datasets (the adapter trains on them mixed, so a
    variation in one dataset's train and another's validation would leak). It starts from the
    deterministic share; then each dataset with >= 2 variations but an empty side gets its
    first-ranked variation moved across, and a dataset from a single variation goes to train
    (trainable, if not evaluable), each move only where no other dataset loses a side."""
    held = validation_variations(set().union(*by_dataset.values()), fraction)
    splittable = [keys for keys in by_dataset.values() if len(keys) >= 2]
    moved_one = True
    while moved_one:  # each move gives one more dataset both sides and takes none away: it ends
        moved_one = False
        for keys in (k for k in splittable if not _both_sides(k, held)):
            into_held = not keys & held
            for key in sorted(keys - held if into_held else keys & held, key=_rank):
                after = held | {key} if into_held else held - {key}
                if _harmless(after, held, splittable):
                    held, moved_one = after, True
                    break
    for keys in by_dataset.values():
        if len(keys) == 1 and keys <= held and _harmless(held - keys, held, splittable):
            held = held - keys
    return held


def calibration_variations(held_out: set[str]) -> set[str]:
    """Every second held-out variation (in a rank of its own, not the held-out set's), for the review
    threshold's calibration; none when fewer than two are held out (then calibration falls back to
    the validation rows it will be scored on, and says so)."""
    if len(held_out) < 2:
        return set()
    return set(sorted(held_out, key=lambda key: _rank(f"calibration/{key}"))[1::2])


def split_rows(
    rows: list[dict[str, Any]], held_out: set[str], calibration: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """train / validation, and `calibration` (a part of the held-out variations) when it is given."""
    calibration = calibration or set()
    side: dict[str, list[dict[str, Any]]] = {"train": [], "validation": [], "calibration": []}
    for r in rows:
        key = variation_key(r["meta"])
        side["calibration" if key in calibration else "validation" if key in held_out else "train"].append(r)
    return side if calibration else {"train": side["train"], "validation": side["validation"]}


def warn_about(name: str, splits: dict[str, list[dict[str, Any]]]) -> None:
    """Name a dataset that training cannot use as it is: a missing split, or one review label."""
    variations = {variation_key(r["meta"]) for rows in splits.values() for r in rows}
    for split, rows in splits.items():
        if not rows:
            why = (
                "its rows come from one task variation, which cannot be on both sides"
                if len(variations) < 2
                else "no held-out set gives every dataset both sides without sharing a variation"
            )
            print(f"warning: {name} has no {split} split: {why} (roll out more task variations)", file=sys.stderr)
    labels = Counter(r["meta"]["label"] for rows in splits.values() for r in rows)
    if name.startswith("review") and len(labels) < 2:
        print(
            f"warning: {name} has only the label {next(iter(labels))!r}; a controller cannot learn "
            "both decisions from it (add exploratory rollouts or more tasks)",
            file=sys.stderr,
        )
