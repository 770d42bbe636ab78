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
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.args import TrainScriptArguments


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
    from train.card import write_adapter_files
    from train.crashes import last_checkpoint, oom_advice
    from train.distributed import end_training

    trainer, card = build_trainer(script_args, training_args, model_args)
    with oom_advice(training_args):
        trainer.train(resume_from_checkpoint=last_checkpoint(training_args))

    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        # PEFT saves every adapter; the frozen reference copy is not part of the result.
        shutil.rmtree(Path(training_args.output_dir) / "ref", ignore_errors=True)
        write_adapter_files(training_args.output_dir, card, script_args, training_args, model_args)
    trainer.accelerator.print(f"adapter saved to {training_args.output_dir}")
    end_training(trainer)  # finish trackers, destroy the process group
    return trainer


def build_trainer(script_args: DPOScriptArguments, training_args, model_args):
    """(DPOTrainer on the SFT adapter, or on a fresh LoRA adapter; the adapter card's fields)."""
    from peft import PeftModel
    from trl import DPOTrainer, get_peft_config

    from rir_runtime.llm.tuned import read_card
    from train.data import drop_overlong, load_datasets
    from train.distributed import check_launch, main_process_first
    from train.models import check_lora_targets, load_base_model, load_tokenizer, resolve_base

    check_launch(training_args)
    sft_adapter = script_args.sft_adapter
    sft_card = read_card(sft_adapter) if sft_adapter else None
    if sft_card and not script_args.model and not model_args.model_name_or_path:
        script_args.model = sft_card["base_model"]
    with main_process_first(training_args, "preparing the model and datasets"):
        base_name, base_path = resolve_base(script_args, model_args)
        if sft_adapter and sft_card:
            check_same_base(sft_card, sft_adapter, base_name, base_path)
        tokenizer = load_tokenizer(sft_adapter or base_path)
        need_eval = training_args.eval_strategy != "no" or training_args.eval_on_start
        train_ds, eval_ds, fingerprints, types = load_datasets(script_args, "pref", need_eval, training_args.seed)
        train_ds = drop_overlong(train_ds, tokenizer, training_args.max_length, "train")
        eval_ds = drop_overlong(eval_ds, tokenizer, training_args.max_length, "eval")

    model = load_base_model(base_path, model_args, training_args)
    if sft_adapter and sft_card:
        model = PeftModel.from_pretrained(model, sft_adapter, is_trainable=True)
        peft_config = None  # TRL copies the loaded adapter into a frozen "ref" adapter: the reference
    else:
        model_args.use_peft = True
        peft_config = get_peft_config(model_args)
        check_lora_targets(model, peft_config, base_name)

    trainer = DPOTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    card = dict(
        base_model=base_name,
        base_model_path=base_path,
        decision_types=types,
        fingerprints=fingerprints,
        stage="dpo",
        extra={"sft_adapter": script_args.sft_adapter},
    )
    return trainer, card


def check_same_base(card: dict, adapter: str, base_name: str, base_path: str) -> None:
    """The SFT adapter must sit on the base model we load (else the LoRA shapes or meaning differ)."""
    from rir_runtime.llm.tuned import base_model_location

    if card["base_model"] == base_name or Path(base_model_location(card)).resolve() == Path(base_path).resolve():
        return
    from rir_runtime.errors import UserInputError

    raise UserInputError(
        f"sft_adapter {adapter} was trained on base model '{card['base_model']}', but the model "
        f"is '{base_name}': drop --model (the adapter's base is used) or pass "
        f"--model {card['base_model']}"
    )


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DPOConfig, ModelConfig, TrlParser

    # `Any`: TRL types these as `DataClassType`, a NewType over Any that no class matches
    dataclass_types: tuple[Any, ...] = (DPOScriptArguments, DPOConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("dpo", help="train a controller adapter with DPO", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    import sys

    from train.args import run_script

    sys.exit(run_script(main, make_parser(prog="python -m train.dpo")))
