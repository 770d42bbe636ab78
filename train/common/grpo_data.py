"""The GRPO view of the `review_sft` and `locate_sft` datasets of `rir build-data`: each row's prompt
and the columns the rewards read (`data_gen/scoring/rewards.py`: `view_row`), taken from its `meta`.

| column | meaning |
| --- | --- |
| `prompt` | the decision prompt (chat messages), as rendered for the controllers |
| `decision` | review, locate_coarse or locate_fine |
| `label` | the hindsight answer (review verdict, segment, checkpoint) |
| `weight` | the inverse frequency of the answer's class in the training split (`answer_class`, `data_gen/scoring`) |
| `values` | JSON {checkpoint: V} for every admissible checkpoint, measured or implied |
| `values_implied` | whether some of them were implied rather than measured |
| `v_now`, `best_value` | V at the decision, and the best V a restore reaches |
| `choices` | JSON {answer: [checkpoints it restores to]} of the answers the prompt offers |
| `segments` | JSON [[start, end), ...]: the coarse segments the prompt offers (locate_coarse) |
| `job`, `review_index` | the decision point: the episode's job (JSON) and which of its reviews (online rewards) |
| `opening` | the answer's fixed JSON opening when the prompt is prefilled with it (`prefill_answers`), else "" |

Prefilled prompts (`prefill_answer`, the default) are the rendered chat text followed by the
answer's opening (`{"decision": "`), so a sampled completion is the decision itself: at
temperature 1 the answers are drawn from the very probabilities the ranking controller compares
at inference, and a small adapter cannot lose its reward to a malformed JSON wrapper.

With bisection (`rir build-data` with bisect, the default) only the probed checkpoints are measured.
V can only fall along a branch when errors are irreversible, so an unprobed checkpoint lies
between the nearest probed ones before and after it; it takes the later one's value, which is
exact where the two agree (always, after a bisection over 0/1 values) and a lower bound otherwise.
"""

from __future__ import annotations

from typing import Any

from data_gen.scoring.answers import train_class_weights
from data_gen.scoring.rewards import view_row
from rir_runtime.decisions import ANSWER_OPENING
from rir_runtime.errors import UserInputError
from train.common.args import TrainScriptArguments

GRPO_TYPES = ("review", "locate")
META_KEYS = ("decision", "label", "values", "v_now", "context")
IMPLIED_BY = "bisection: V only falls along a branch, so an unprobed checkpoint takes the next probed value"


def prefill_answers(ds: Any, tokenizer: Any) -> Any:
    """The rows with each chat prompt rendered as the model will see it, ending in the opening of
    the answer (the ranking controller scores what follows the same text)."""

    def prefill(row: dict[str, Any]) -> dict[str, Any]:
        opening = ANSWER_OPENING[row["decision"]]
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        return {"prompt": text + opening, "opening": opening}

    return ds.map(prefill, keep_in_memory=True)


def _check_meta(folder: Any, ds: Any) -> None:
    meta = ds[0]["meta"] if len(ds) else {}
    missing = [k for k in META_KEYS if (meta or {}).get(k) is None]  # Arrow keeps absent struct keys as None
    if missing:
        raise UserInputError(
            f"dataset {folder} rows lack meta {missing}: GRPO reads each row's value table from meta; "
            "rebuild the data with this version's `rir build-data`"
        )


def load_grpo_datasets(
    script_args: TrainScriptArguments, need_eval: bool, seed: int = 42
) -> tuple[Any, Any | None, dict[str, str], list[str]]:
    """(train, eval or None, {"<name>/<split>": fingerprint}, decision types): the GRPO view of the
    chosen `*_sft` folders, mixed, shuffled and capped like `train.common.data.load_datasets`. Class
    weights come from the whole training split, before the cap."""
    from train.common.data import dataset_folders, decision_types_of, read_splits, shuffled_and_capped

    folders = dataset_folders(script_args.data, "sft", script_args.decision_types)
    read, fingerprints = read_splits(script_args, folders, "sft", need_eval)
    for name, ds in (pair for named in read.values() for pair in named):
        _check_meta(folders[name], ds)
    metas = [m for _, ds in read[script_args.train_split] for m in ds["meta"]]
    weights = train_class_weights(metas, script_args.balance_review, script_args.balance_locate)
    parts = {
        split: [
            ds.map(view_row, fn_kwargs={"weights": weights}, remove_columns=["completion", "meta"], keep_in_memory=True)
            for _, ds in named
        ]
        for split, named in read.items()
    }
    train, held_out = shuffled_and_capped(parts, script_args, folders, seed)
    return train, held_out, fingerprints, decision_types_of(list(folders))


def value_summary(ds: Any, weights_from: str = "train split") -> dict[str, Any]:
    """What the adapter card says about the values the rewards read."""
    implied = sum(ds["values_implied"])
    return {
        "source": "V(C_i) measured by re-executing each branch with the expert plan (`rir build-data`)",
        "rows": len(ds),
        "rows_with_implied_values": implied,
        "implied_by": IMPLIED_BY if implied else None,
        "review_class_weights": f"inverse label frequency in the {weights_from}",
        "locate_class_weights": f"inverse frequency of stay / step back restore points in the {weights_from}",
    }
