"""Preference tuning (DPO) of a controller LoRA adapter on the `*_pref` datasets of `rir build-data`.

# CPU, after `train.sft` (continues the SFT adapter)
```bash
python -m train.dpo --config configs/train/dpo_cpu_quick.yaml --data /tmp/traindata \
    --sft_adapter runs/sft-quick --output-dir runs/dpo-quick
rir train dpo --config configs/train/dpo_cpu_quick.yaml --sft-adapter runs/sft-quick --max-steps 10
```

# GPU
```bash
accelerate launch --config_file configs/accelerate/single_gpu.yaml -m train.dpo \
    --config configs/train/dpo_qwen2.5-0.5b.yaml --sft_adapter runs/sft-qwen0.5b --output-dir runs/dpo-qwen0.5b
```

With `sft_adapter`, the base model is loaded with that adapter as a trainable `PeftModel`; TRL
keeps a frozen copy of it as the reference (so the reference policy is the SFT policy), and the
saved adapter is the SFT adapter moved on by DPO: it loads on the bare base model like any other.
The LoRA settings (`lora_r`, ...) of the config apply only when starting without `sft_adapter`;
then the reference is the base model (adapter disabled). Eval logs `rewards/accuracies` (the
share of validation pairs whose chosen reply gets the higher implicit reward) and `rewards/margins`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from train.common.args import TrainScriptArguments


@dataclass
class DPOScriptArguments(TrainScriptArguments):
    sft_adapter: str | None = field(
        default=None,
        metadata={
            "help": "adapter folder of `rir train sft` to start from (its base model is used unless --model is given)"
        },
    )


def main(script_args: DPOScriptArguments, training_args, model_args):
    """Train and save the adapter into output_dir; returns the trainer (state, logs, model)."""
    from train.common.run import train_and_save

    trainer, card = build_trainer(script_args, training_args, model_args)
    return train_and_save(trainer, card, script_args, training_args, model_args)


def build_trainer(script_args: DPOScriptArguments, training_args, model_args):
    """(DPOTrainer on the SFT adapter, or on a fresh LoRA adapter; the adapter card's fields). From the SFT
    adapter, TRL copies it into a frozen "ref" adapter: the reference policy."""
    from trl import DPOTrainer

    from train.common.data import dataset_folders
    from train.common.setup import prompt_completion_datasets, set_up

    dataset_folders(script_args.data, "pref", script_args.decision_types)  # before the base model is converted
    load = prompt_completion_datasets(script_args, training_args, "pref")
    setup = set_up(script_args, training_args, model_args, load, start_adapter=script_args.sft_adapter)
    trainer = DPOTrainer(**setup.trainer_arguments(training_args))
    return trainer, setup.card("dpo", extra={"sft_adapter": script_args.sft_adapter})


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DPOConfig, ModelConfig, TrlParser

    # `Any`: TRL types these as `DataClassType`, a NewType over Any that no class matches
    dataclass_types: tuple[Any, ...] = (DPOScriptArguments, DPOConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("dpo", help="train a controller adapter with DPO", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    import sys

    from train.common.args import run_script

    sys.exit(run_script(main, make_parser(prog="python -m train.dpo")))
