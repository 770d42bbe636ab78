"""GRPO rewards for review and locate answers, read off each row's hindsight value table.

Every checkpoint's value V (the chance to still succeed from it) was measured by re-executing the
branch when the data was built, so an answer is scored exactly and without calling an environment:

- locate: the value of the checkpoint the answer restores to (a coarse answer: the best checkpoint
  of its segment, which the fine decision can then reach), minus a lateness penalty that orders
  answers of equal value by the progress they throw away. The penalty is a fraction of the
  smallest gap between two values of the table, so a higher value always wins. An answer the
  prompt does not offer, or a reply that does not parse, gets 0. The reward is weighted by the
  class of the row's label (stay at the current checkpoint, or step back) as review rewards are.
- review: agreement with the hindsight verdict, times the verdict's class weight (the inverse of
  its frequency in the training split). Answering one way always then earns 1/k of the best
  mean reward (k classes): with weights from the same rows, the mean reward is the balanced
  accuracy, so the majority class cannot be won by a constant answer.

`review_reward` and `locate_reward` have the signature of TRL's reward functions (the dataset's
columns come as keyword lists); each answers None for the other's rows, which TRL leaves out of
that function's mean. Where the prompt was prefilled with the answer's opening (the `opening`
column), the completion is read after it.

`view_row` is a `*_sft` row as the rewards read it (the columns of GRPO's dataset, `train/common/grpo_data.py`);
`decision_reward` scores one decision on such a row, which is how `rir eval-controller` reports the
reward GRPO maximises, comparable across adapters and the heuristic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from data_gen.scoring.answers import LOCATE_KINDS, answer_class, train_class_weights
from rir_runtime.decisions import DecisionKind, dump, parse
from rir_runtime.errors import ParseError, UserInputError
from rir_runtime.values import complete_values

DEFAULT_LATENESS = 0.5  # the earliest of equal answers keeps half of a value gap


# --- review -------------------------------------------------------------------------------------
def review_verdict(text: str) -> str | None:
    """The review decision of a reply, or None when it states none. A reply cut inside its reason
    (max_completion_length) still counts: the decision is its first key, which is also all the
    ranking controller scores at inference."""
    try:
        return parse("review", text).decision
    except ParseError:
        pass
    head = text.split(",", 1)[0]
    try:
        return parse("review", head + "}").decision
    except ParseError:
        return None


def review_score(text: str, label: str, weight: float = 1.0) -> float:
    """`weight` when the reply's decision is the hindsight verdict `label`, else 0 (unparseable too)."""
    return weight if review_verdict(text) == label else 0.0


# --- locate -------------------------------------------------------------------------------------
def smallest_gap(values: Sequence[float]) -> float:
    """The smallest positive difference between two distinct values, 0 included (1.0 if none)."""
    distinct = sorted(set(values) | {0.0})
    gaps = [b - a for a, b in zip(distinct[:-1], distinct[1:], strict=True)]
    return min(gaps) if gaps else 1.0


def restore_value(checkpoint: int, values: Mapping[int, float], offered: Sequence[int], lateness: float) -> float:
    """V(checkpoint) less `lateness` x (smallest value gap) x (the share of the offered range that lies
    between it and the latest offered checkpoint of the same value); 0 where V is 0."""
    v = values[checkpoint]
    if v <= 0:
        return 0.0
    latest = max(i for i in offered if values[i] == v)
    span = max(1, latest - min(offered))
    return v - lateness * smallest_gap([values[i] for i in offered]) * (latest - checkpoint) / span


def best_in(checkpoints: Sequence[int], values: Mapping[int, float]) -> int:
    """The latest checkpoint of maximal value among `checkpoints`."""
    top = max(values[i] for i in checkpoints)
    return max(i for i in checkpoints if values[i] == top)


def locate_score(
    kind: DecisionKind,
    text: str,
    values: Mapping[int, float],
    choices: Mapping[int, Sequence[int]],
    lateness: float = DEFAULT_LATENESS,
) -> float:
    """The reward of a locate reply. `choices` maps each answer the prompt offers (a segment index,
    or a checkpoint) to the checkpoints it restores to; `values` covers all of them."""
    try:
        answer = parse(kind, text)
    except ParseError:
        return 0.0
    reached = choices.get(answer) or ()
    if not reached:
        return 0.0
    offered = sorted({i for cps in choices.values() for i in cps})
    return restore_value(best_in(reached, values), values, offered, lateness)


# --- TRL reward functions ------------------------------------------------------------------------
def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def table(values_json: str) -> dict[int, float]:
    return {int(k): float(v) for k, v in json.loads(values_json).items()}


def answers(choices_json: str) -> dict[int, list[int]]:
    return {int(k): [int(i) for i in v] for k, v in json.loads(choices_json).items()}


def replies(completions: list[Any], opening: list[str] | None) -> list[str]:
    """Each completion's whole reply: the prefilled opening (if any) and the sampled text."""
    heads = opening or [""] * len(completions)
    return [head + completion_text(c) for head, c in zip(heads, completions, strict=True)]


def review_reward(
    completions: list[Any],
    decision: list[str],
    label: list[str],
    weight: list[float],
    opening: list[str] | None = None,
    **_: Any,
) -> list[float | None]:
    """Weighted agreement with the hindsight verdict, for review rows (None elsewhere)."""
    return [
        review_score(text, lab, w) if kind == "review" else None
        for text, kind, lab, w in zip(replies(completions, opening), decision, label, weight, strict=True)
    ]


def locate_reward(
    completions: list[Any],
    decision: list[str],
    values: list[str],
    choices: list[str],
    opening: list[str] | None = None,
    lateness: float = DEFAULT_LATENESS,
    weight: list[float] | None = None,
    **_: Any,
) -> list[float | None]:
    """The restored checkpoint's value with the lateness order, times the row's class weight (stay or
    step back), for locate rows (None elsewhere)."""
    weights = weight or [1.0] * len(completions)
    out: list[float | None] = []
    rows = zip(replies(completions, opening), decision, values, choices, weights, strict=True)
    for text, kind, vals, chs, w in rows:
        if kind in LOCATE_KINDS:
            out.append(w * locate_score(kind, text, table(vals), answers(chs), lateness))
        else:
            out.append(None)
    return out


# --- a labelled row, as the rewards read it --------------------------------------------------------
def offered_choices(kind: str, ctx: dict[str, Any]) -> dict[int, list[int]]:
    """{answer: checkpoints it restores to} for the answers a locate prompt offers (its closed set)."""
    admissible = [int(i) for i in ctx["admissible"]]
    if kind == "locate_coarse":
        return {s: [i for i in admissible if a <= i < b] for s, (a, b) in enumerate(ctx["segments"])}
    if kind == "locate_fine":
        a, b = ctx["segment"] or (0, max(admissible, default=0) + 1)
        return {i: [i] for i in admissible if a <= i < b}
    return {}


def view_row(row: dict[str, Any], weights: Mapping[str, float]) -> dict[str, Any]:
    """One GRPO row from one `*_sft` row."""
    meta = row["meta"]
    kind, label = meta["decision"], str(meta["label"])
    ctx = json.loads(meta["context"])
    measured = {int(k): float(v) for k, v in json.loads(meta["values"]).items()}
    tab = complete_values(measured, [int(i) for i in ctx["admissible"]])
    admissible_values = [tab.values[int(i)] for i in ctx["admissible"]]
    return {
        "decision": kind,
        "label": label,
        "weight": weights.get(answer_class(meta) or "", 1.0),
        "values": json.dumps({str(k): v for k, v in tab.values.items()}),
        "values_implied": bool(tab.implied),
        "v_now": float(meta["v_now"]),
        "best_value": max(admissible_values, default=float(meta["v_now"])),
        "choices": json.dumps({str(k): v for k, v in offered_choices(kind, ctx).items()}),
        "segments": json.dumps(ctx.get("segments") or []),
        "opening": "",
        # the decision point, for rewards that play the decision out (empty in data built before them)
        "job": str(meta.get("job") or ""),
        "review_index": int(meta["review_index"]) if meta.get("review_index") is not None else -1,
    }


def review_weights(data: str | Path) -> dict[str, float]:
    """The review class weights GRPO trains with: inverse label frequency in the train split. Restore
    points are scored unweighted, so offline locate rewards stay comparable across builds."""
    from datasets import load_from_disk

    folder = Path(data) / "review_sft"
    if not (folder / "dataset_dict.json").is_file():
        raise UserInputError(f"{folder} is not a dataset of `rir build-data`: pass its --out folder as --data")
    dataset = load_from_disk(str(folder))
    return train_class_weights(dataset["train"]["meta"], review=True, locate=False) if "train" in dataset else {}


def decision_reward(
    kind: DecisionKind,
    value: Any,
    row: dict[str, Any],
    weights: Mapping[str, float],
    lateness: float = DEFAULT_LATENESS,
) -> float | None:
    """The reward of one review or locate decision on its `*_sft` row; None for a row built without
    a value table (datasets older than the `values` column)."""
    if "values" not in row["meta"]:
        return None
    cols = {k: [v] for k, v in view_row(row, weights).items()}
    answer = [dump(kind, value)]
    reward = review_reward(answer, **cols) if kind == "review" else locate_reward(answer, **cols, lateness=lateness)
    return float(reward[0] or 0.0)
