"""The GRPO reward of controllers on held-out rows, and the reward curve of a GRPO run.

    python -m train.reward_eval --data data/controller \
        --controller tuned:runs/sft-X,tuned:runs/dpo-X,tuned:runs/grpo-X,heuristic
    python -m train.reward_eval --curve runs/grpo-X

Each controller decides every review and locate row of the split (the situation is the row's
serialised `DecisionContext`), its decision is written as the JSON answer a model would give, and
`train/rewards.py` scores it against the row's value table: the reward GRPO maximises, comparable
across SFT, DPO and GRPO adapters. Review weights come from the train split, as in training.
`--curve` reads `trainer_state.json` of a run's output folder: the mean reward per logged step.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rir_runtime.errors import UserInputError
from train.rewards import DEFAULT_LATENESS, class_weights, locate_reward, review_reward


@dataclass
class RewardEvalConfig:
    data: str = field(default="data/controller", metadata={"help": "folder of `rir build-data` (review_sft, ...)"})
    controller: list[str] = field(default_factory=list, metadata={"help": "comma list of controllers to score"})
    split: str = field(default="validation", metadata={"help": "split to score"})
    max_rows: int = field(default=0, metadata={"help": "rows per dataset at most (0: all)"})
    lateness_penalty: float = field(default=DEFAULT_LATENESS, metadata={"help": "as in `rir train grpo`"})
    curve: str = field(default="", metadata={"help": "a GRPO output folder: print its reward per logged step"})

    def __post_init__(self) -> None:
        if "oracle" in self.controller:
            raise ValueError("the oracle needs a live environment; score heuristic, prompted:<m> or tuned:<adapter>")


def split_rows(data: str, name: str, split: str) -> list[dict[str, Any]]:
    from datasets import load_from_disk

    folder = Path(data) / name
    if not (folder / "dataset_dict.json").is_file():
        raise UserInputError(f"{folder} is not a dataset of `rir build-data`: pass its --out folder as --data")
    dd = load_from_disk(str(folder))
    return list(dd[split]) if split in dd else []


def score_controller(spec: str, rows: Sequence[dict[str, Any]], weights: dict[str, float], lateness: float) -> dict:
    """{decision kind: mean reward} and the row counts, for one controller."""
    from rir_runtime.controllers import make_controller
    from rir_runtime.decisions import DecisionKind, dump
    from rir_runtime.prompts import DecisionContext
    from train.grpo_data import view_row

    controller = make_controller(spec)
    rewards: dict[str, list[float]] = {}
    for row in rows:
        kind = cast(DecisionKind, row["meta"]["decision"])  # review, locate_coarse or locate_fine
        decision = getattr(controller, kind)(DecisionContext.from_json(row["meta"]["context"]))
        cols = {k: [v] for k, v in view_row(row, weights).items()}
        answer = [dump(kind, decision.value)]
        reward = review_reward(answer, **cols) if kind == "review" else locate_reward(answer, **cols, lateness=lateness)
        rewards.setdefault(kind, []).append(float(reward[0] or 0.0))
    out: dict[str, Any] = {"controller": spec}
    for name, values in sorted(rewards.items()):
        out[f"{name}_reward"], out[f"{name}_rows"] = sum(values) / len(values), len(values)
    every = [v for values in rewards.values() for v in values]
    out["mean_reward"] = sum(every) / len(every) if every else None
    return out


def evaluate(cfg: RewardEvalConfig) -> list[dict[str, Any]]:
    rows, train_labels = [], []
    for name in ("review_sft", "locate_sft"):
        found = split_rows(cfg.data, name, cfg.split)
        rows += found[: cfg.max_rows] if cfg.max_rows else found
        if name == "review_sft":
            train_labels = [r["meta"]["label"] for r in split_rows(cfg.data, name, "train")]
    weights = class_weights(train_labels) if train_labels else {}
    return [score_controller(spec, rows, weights, cfg.lateness_penalty) for spec in cfg.controller]


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
    add_dataclass_arguments(parser, RewardEvalConfig)
    cfg = parse_config(RewardEvalConfig, parser.parse_args(argv))
    if cfg.curve:
        for step, reward in reward_curve(cfg.curve):
            print(f"{step}\t{reward:.4f}")
        return 0
    if not cfg.controller:
        raise UserInputError("pass --controller (a comma list: tuned:<adapter>, heuristic, ...) or --curve <run>")
    for result in evaluate(cfg):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserInputError as err:
        print(f"rir: error: {err}", file=sys.stderr)
        sys.exit(2)
