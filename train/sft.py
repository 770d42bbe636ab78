"""Supervised fine-tuning of a controller LoRA adapter on the `*_sft` datasets of `rir build-data`.

# CPU, a few minutes (packaged SmolLM2-135M-Instruct)
```bash
python -m train.sft --config configs/train/sft_cpu_quick.yaml --data /tmp/traindata --output-dir runs/sft-quick
rir train sft --config configs/train/sft_cpu_quick.yaml --data /tmp/traindata --max-steps 20
```

# One GPU / many GPUs
```bash
accelerate launch --config_file configs/accelerate/single_gpu.yaml -m train.sft \
    --config configs/train/sft_qwen2.5-0.5b.yaml --data data/controller --output-dir runs/sft-qwen0.5b
accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 8 -m train.sft \
    --config configs/train/sft_qwen2.5-1.5b.yaml --data data/controller
```

All decision types (review, locate, reflect) are mixed into one dataset: the prompt names the
decision ("Decision: review"), so one adapter serves all three. The loss covers the completion
only (prompt-completion data). A rerun into the same output_dir resumes from its last checkpoint.
The adapter folder gets the tokenizer and `rir_controller.json` (checked by `rir_runtime.llm.card`).
"""

from __future__ import annotations

import argparse
from typing import Any

from train.common.args import TrainScriptArguments


def main(script_args: TrainScriptArguments, training_args, model_args):
    """Train and save the adapter into output_dir; returns the trainer (state, logs, model)."""
    from train.common.run import train_and_save

    trainer, card = build_trainer(script_args, training_args, model_args)
    return train_and_save(trainer, card, script_args, training_args, model_args)


def build_trainer(script_args: TrainScriptArguments, training_args, model_args):
    """(SFTTrainer with a fresh LoRA adapter, the adapter card's fields)."""
    from trl import SFTTrainer

    from train.common.data import dataset_folders
    from train.common.setup import prompt_completion_datasets, set_up

    dataset_folders(script_args.data, "sft", script_args.decision_types)  # before the base model is converted
    setup = set_up(
        script_args, training_args, model_args, prompt_completion_datasets(script_args, training_args, "sft")
    )
    return SFTTrainer(**setup.trainer_arguments(training_args)), setup.card("sft")


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import ModelConfig, SFTConfig, TrlParser

    # `Any`: TRL types these as `DataClassType`, a NewType over Any that no class matches
    dataclass_types: tuple[Any, ...] = (TrainScriptArguments, SFTConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("sft", help="train a controller adapter with SFT", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    import sys

    from train.common.args import run_script

    sys.exit(run_script(main, make_parser(prog="python -m train.sft")))
