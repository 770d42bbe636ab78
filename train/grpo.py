"""Reinforcement learning (GRPO) of a controller LoRA adapter on verified restore rewards.

# CPU, after `train.sft` (continues the SFT adapter)
```bash
python -m train.grpo --config configs/train/grpo_cpu_quick.yaml --data /tmp/traindata \
    --sft_adapter runs/sft-cpu-quick --output-dir runs/grpo-cpu-quick
rir train grpo --config configs/train/grpo_cpu_quick.yaml --max-steps 10
rir train grpo --config configs/train/grpo_cpu_quick.yaml --sft_adapter null --model smollm2-135m-instruct
```

# GPU
```bash
accelerate launch --config_file configs/accelerate/single_gpu.yaml -m train.grpo \
    --config configs/train/grpo_qwen2.5-0.5b.yaml --data data/controller
```

TRL's `GRPOTrainer` samples `num_generations` answers per review and locate prompt and scores each
against the row's hindsight value table (`data_gen/scoring/rewards.py`, `train/common/grpo_data.py`): no environment
runs at train time. With `sft_adapter` that adapter is trained further on its own base model;
without it, a fresh LoRA adapter from the config's LoRA keys. With `beta > 0` TRL keeps a
frozen copy of the starting adapter as the KL reference; it is not saved with the result. The
adapter loads as `tuned:<output_dir>`. `scale_rewards: batch` keeps the review class weights in the
advantages (per-group scaling would cancel them: a group's answers share one label). The reward
curve is `reward` (and `rewards/<function>/mean`) in `trainer_state.json` of output_dir
(`python -m train.reward_eval --curve <output_dir>`).
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import Any

from data_gen.scoring.rewards import DEFAULT_LATENESS, locate_reward, review_reward
from rir_runtime.errors import UserInputError
from train.common.args import TrainScriptArguments
from train.common.grpo_common import NoSignalWarning, online_logs, online_reward, reward_settings
from train.common.grpo_data import GRPO_TYPES


@dataclass
class GRPOScriptArguments(TrainScriptArguments):
    decision_types: list[str] = field(
        default_factory=lambda: list(GRPO_TYPES),
        metadata={"help": "decision types to train on (space separated; a YAML list)", "choices": list(GRPO_TYPES)},
    )
    sft_adapter: str | None = field(
        default=None,
        metadata={
            "help": "adapter folder of `rir train sft` to start from (its base model is used unless --model is "
            "given); null or '' starts a fresh adapter on --model"
        },
    )
    value_adapter: str | None = field(
        default=None,
        metadata={
            "help": "adapter folder of `rir train value` to train further instead: its option policy (the softmax "
            "of its option scores at --temperature) is sampled and rewarded (`train/value_grpo.py`)"
        },
    )
    spread_only: bool = field(
        default=False,
        metadata={
            "help": "value adapter: train only on decision points whose options' hindsight values differ, where "
            "the choice matters (elsewhere every sampled option earns one reward and no gradient)"
        },
    )
    hard_points: str = field(
        default="off",
        metadata={
            "help": "value adapter: train (and hold out) only the decision points where the start's served option "
            "earns less than the point's best: by the table's hindsight values, or by playing every option out "
            "from the point as the online reward does (one play, unless --reward_draws: luck decides many); off: all",
            "choices": ["off", "table", "online"],
        },
    )
    balance_review: bool = field(
        default=True,
        metadata={
            "help": "weight each review reward by the inverse frequency of its label in the train split, so "
            "a constant answer cannot win the commoner label (GRPO balances by weights, not by oversampling)"
        },
    )
    balance_locate: bool = field(
        default=True,
        metadata={
            "help": "weight each restore-point reward by the inverse frequency of its answer class (stay at "
            "the current checkpoint, or step back) in the train split"
        },
    )
    prefill_answer: bool = field(
        default=True,
        metadata={
            "help": "end each prompt with the answer's JSON opening, so a sample is the decision alone, drawn "
            "from the probabilities the ranking controller compares (false: the whole JSON is generated)"
        },
    )
    reward: str = field(
        default="table",
        metadata={
            "help": "table: each row's hindsight value table (no environment runs); online: each sampled decision "
            "played out from its decision point's restored state, the reward what it did less the costs below",
            "choices": ["table", "online"],
        },
    )
    rollback_cost: float = field(
        default=0.05, metadata={"help": "online reward: cost of each rollback after the decision"}
    )
    call_cost: float = field(
        default=0.0, metadata={"help": "online reward: cost of each controller model call after the decision"}
    )
    reward_draws: int = field(
        default=0,
        metadata={
            "help": "online reward: 0 plays each decision once, as the agent's own future (its luck decides too); "
            "K > 0 plays it K times with the agent's noise drawn afresh and rewards the mean: its expected outcome"
        },
    )
    reward_workers: int = field(
        default=1, metadata={"help": "online reward: processes (or Ray actors) that play the decisions out"}
    )
    reward_executor: str = field(
        default="local", metadata={"help": "online reward: where decisions play out", "choices": ["local", "ray"]}
    )
    lateness_penalty: float = field(
        default=DEFAULT_LATENESS,
        metadata={
            "help": "locate reward: the share of the smallest value gap the earliest of equal-valued answers "
            "loses against the latest (0: no preference; below 1, a higher value always wins)"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        other = [t for t in self.decision_types if t not in GRPO_TYPES]
        if other:
            raise UserInputError(
                f"decision_types {other} have no value table to reward: GRPO trains {' and '.join(GRPO_TYPES)}; "
                "train reflections with `rir train sft|dpo`"
            )
        if self.sft_adapter in ("", "none", "null"):
            self.sft_adapter = None
        if self.value_adapter in ("", "none", "null"):
            self.value_adapter = None
        if self.value_adapter and self.sft_adapter:
            raise UserInputError(
                "give --sft_adapter (a generative controller) or --value_adapter (a value controller), not both"
            )
        if self.reward_draws < 0 or (self.reward_draws and self.reward != "online"):
            raise UserInputError(f"reward_draws {self.reward_draws}: a whole number >= 0, with --reward online")
        if self.hard_points != "off" and not self.value_adapter:
            raise UserInputError("hard_points screens a value adapter's decision points: give --value_adapter too")
        if self.hard_points == "online" and self.reward != "online":
            raise UserInputError("--hard_points online plays the options out: set --reward online, or judge by table")
        if not 0.0 <= self.lateness_penalty < 1.0:
            raise UserInputError(f"lateness_penalty {self.lateness_penalty} must be within [0, 1)")


def main(script_args: GRPOScriptArguments, training_args, model_args):
    """Train and save the adapter into output_dir; returns the trainer (state, logs, model)."""
    from train.common.run import train_and_save

    if script_args.value_adapter:
        from train import value_grpo

        trainer, card = value_grpo.build_trainer(script_args, training_args, model_args)
    else:
        trainer, card = build_trainer(script_args, training_args, model_args)
    return train_and_save(trainer, card, script_args, training_args, model_args)


def reward_functions(script_args: GRPOScriptArguments) -> list[Any]:
    """Module-level functions (a partial unwraps to its function's name in TRL's logs), so they pickle;
    online, one `OnlineReward` that plays every decision out."""
    online = online_reward(script_args)
    if online is not None:
        return [online]
    return [review_reward, functools.partial(locate_reward, lateness=script_args.lateness_penalty)]


def build_trainer(script_args: GRPOScriptArguments, training_args, model_args):
    """(GRPOTrainer on the SFT adapter, or on a fresh LoRA adapter; the adapter card's fields). With
    beta > 0 and an SFT adapter, TRL copies it into a frozen "ref" adapter (the KL reference)."""
    from trl import GRPOTrainer

    from train.common.data import dataset_folders
    from train.common.grpo_data import load_grpo_datasets, prefill_answers, value_summary
    from train.common.setup import set_up
    from train.common.step_phases import StepPhases

    def load(tokenizer, need_eval: bool):
        train_ds, eval_ds, fingerprints, types = load_grpo_datasets(script_args, need_eval, training_args.seed)
        if script_args.prefill_answer:
            train_ds = prefill_answers(train_ds, tokenizer)
            eval_ds = prefill_answers(eval_ds, tokenizer) if eval_ds is not None else None
        return train_ds, eval_ds, fingerprints, types

    dataset_folders(script_args.data, "sft", script_args.decision_types)  # before the base model is converted
    setup = set_up(script_args, training_args, model_args, load, start_adapter=script_args.sft_adapter)
    rewards = reward_functions(script_args)
    phases = StepPhases()  # generation, rewards, scoring and backward seconds in the train logs
    trainer = GRPOTrainer(
        reward_funcs=rewards,
        callbacks=[NoSignalWarning(), *online_logs(rewards), phases],
        **setup.trainer_arguments(training_args),
    )
    phases.attach(trainer)
    extra = {
        "sft_adapter": script_args.sft_adapter,
        "values": value_summary(setup.train_dataset),
        "rewards": reward_settings(script_args),
        "prefill_answer": script_args.prefill_answer,
    }
    return trainer, setup.card("grpo", extra=extra)


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import GRPOConfig, ModelConfig, TrlParser

    # `Any`: TRL types these as `DataClassType`, a NewType over Any that no class matches
    dataclass_types: tuple[Any, ...] = (GRPOScriptArguments, GRPOConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser(
            "grpo", help="train a controller adapter with GRPO", dataclass_types=dataclass_types
        )
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    import sys

    from train.common.args import run_script

    sys.exit(run_script(main, make_parser(prog="python -m train.grpo")))
