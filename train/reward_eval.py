"""The GRPO reward of a controller's decision on a held-out row, and the reward curve of a GRPO run.

    rir eval-controller --data data/controller --controller tuned:runs/sft-X tuned:runs/grpo-X heuristic
    python -m train.reward_eval --curve runs/grpo-X

`rir eval-controller` scores each review and locate decision with `decision_reward`: the decision
is written as the JSON answer a model would give, and `train/rewards.py` scores it against the
row's value table. That is the reward GRPO maximises, comparable across SFT, DPO and GRPO adapters
and the heuristic, on the same rows as the rest of the offline table. Review weights come from the
train split, as in training. `--curve` reads `trainer_state.json` of a run's output folder: the
mean reward per logged step.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rir_runtime.decisions import DecisionKind, dump
from rir_runtime.errors import UserInputError
from train.grpo_data import train_class_weights, view_row
from train.rewards import DEFAULT_LATENESS, locate_reward, review_reward


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


@dataclass
class RewardCurveConfig:
    curve: str = field(default="", metadata={"help": "a GRPO output folder: print its reward per logged step"})


def reward_curve(output_dir: str) -> list[tuple[int, float]]:
    """(step, mean reward) of every logged training step of a GRPO run."""
    path = Path(output_dir) / "trainer_state.json"
    if not path.is_file():
        raise UserInputError(f"{path} does not exist: pass the output folder of `rir train grpo`")
    logs = json.loads(path.read_text())["log_history"]
    return [(int(e["step"]), float(e["reward"])) for e in logs if "reward" in e]


def main(argv: Sequence[str] | None = None) -> int:
    from rir_runtime.config import FlagParser, add_dataclass_arguments, parse_config

    parser = FlagParser(prog="python -m train.reward_eval", description=__doc__)
    add_dataclass_arguments(parser, RewardCurveConfig)
    cfg = parse_config(RewardCurveConfig, parser.parse_args(argv))
    if not cfg.curve:
        raise UserInputError(
            "pass --curve <output folder of rir train grpo>; `rir eval-controller` scores controllers' rewards"
        )
    for step, reward in reward_curve(cfg.curve):
        print(f"{step}\t{reward:.4f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserInputError as err:
        print(f"rir: error: {err}", file=sys.stderr)
        sys.exit(2)
