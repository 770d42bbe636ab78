"""The reward curve of a GRPO run: the mean reward per logged step, from `trainer_state.json` of its
output folder.

    python -m train.reward_eval --curve runs/grpo-X
    rir eval-controller --data data/controller --controller tuned:runs/sft-X tuned:runs/grpo-X heuristic

The reward of a controller's decision on a held-out row (`decision_reward`, the reward GRPO maximises)
is scored by `rir eval-controller`, from `data_gen/scoring/rewards.py`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rir_runtime.errors import UserInputError, exit_code


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
    from rir_runtime.orchestration.config import FlagParser, add_dataclass_arguments, parse_config

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
    sys.exit(exit_code(main))
