"""The one way a controller adapter is trained and saved, shared by SFT, DPO and GRPO: train
(resuming from the newest checkpoint after a kill), save the adapter without TRL's frozen reference
copy, keep the training log, write the adapter card, and shut the distributed run down.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def train_and_save(trainer: Any, card: dict, script_args: Any, training_args: Any, model_args: Any) -> Any:
    """Train `trainer` and save its adapter into output_dir; returns the trainer (state, logs, model)."""
    from train.adapter_files import write_adapter_files
    from train.crashes import last_checkpoint, oom_advice
    from train.distributed import end_training

    with oom_advice(training_args):
        trainer.train(resume_from_checkpoint=last_checkpoint(training_args))

    trainer.save_model(training_args.output_dir)  # adapter + tokenizer
    if trainer.accelerator.is_main_process:
        # DPO and GRPO (beta > 0) keep a frozen "ref" copy of the starting adapter: not part of the result
        shutil.rmtree(Path(training_args.output_dir) / "ref", ignore_errors=True)
        trainer.save_state()  # trainer_state.json: the loss (and GRPO's reward) curve
        write_adapter_files(training_args.output_dir, card, script_args, training_args, model_args)
    trainer.accelerator.print(f"adapter saved to {training_args.output_dir}")
    end_training(trainer)  # finish trackers, destroy the process group
    return trainer
