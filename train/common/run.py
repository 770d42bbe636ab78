"""The one way a controller adapter is trained and saved, shared by SFT, DPO, GRPO and the value model:
train (resuming from the newest checkpoint after a kill), save the adapter without TRL's frozen
reference copy, keep the training log, write the files next to the adapter, calibrate the review
threshold, and shut the distributed run down.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any


def train_and_save(trainer: Any, card: dict, script_args: Any, training_args: Any, model_args: Any) -> Any:
    """Train `trainer` and save its adapter into output_dir; returns the trainer (state, logs, model)."""
    from rir_runtime.orchestration.output_lock import exclusive_output
    from train.common.distributed import end_training

    # one run per output folder: its first process holds it (a second run would resume from the first's
    # checkpoints and train past max_steps)
    held = exclusive_output(training_args.output_dir) if trainer.accelerator.is_main_process else nullcontext()
    with held:
        _train_and_save(trainer, card, script_args, training_args, model_args)
    trainer.accelerator.print(f"adapter saved to {training_args.output_dir}")
    end_training(trainer)  # finish trackers, destroy the process group
    return trainer


def _train_and_save(trainer: Any, card: dict, script_args: Any, training_args: Any, model_args: Any) -> None:
    from train.common.crashes import last_checkpoint, oom_advice, storage_errors

    with oom_advice(training_args), storage_errors(training_args.output_dir):
        start = last_checkpoint(training_args)
        if start and finished(start, training_args.max_steps):
            load_finished(trainer, start)
        else:
            trainer.train(resume_from_checkpoint=start)
        trainer.save_model(training_args.output_dir)  # adapter + tokenizer
    if trainer.accelerator.is_main_process:
        # DPO and GRPO (beta > 0) keep a frozen "ref" copy of the starting adapter: not part of the result
        shutil.rmtree(Path(training_args.output_dir) / "ref", ignore_errors=True)
        trainer.save_state()  # trainer_state.json: the loss (and GRPO's reward) curve
        finish_adapter(training_args.output_dir, card, script_args, training_args, model_args)


def finished(checkpoint: str, max_steps: int) -> bool:
    """Whether a checkpoint already holds the run's last step. Resumed from it, the Trainer would take
    one step more before it checks the step count (a run killed between its last checkpoint and the
    saved adapter, or a second run into a finished folder, would end past max_steps)."""
    import json

    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return max_steps > 0 and int(state.get("global_step", 0)) >= max_steps


def load_finished(trainer: Any, checkpoint: str) -> None:
    """The finished checkpoint's weights and state in `trainer`, as if it had just trained them."""
    from transformers import TrainerState

    trainer._load_from_checkpoint(checkpoint)  # the adapter's weights (the Trainer's own resume path)
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    trainer.accelerator.print(f"{checkpoint} holds the last of max_steps: its adapter is saved, not trained further")


def finish_adapter(output_dir: str, card: dict, script_args: Any, training_args: Any, model_args: Any) -> None:
    """The files next to the saved adapter (its card says `review_threshold: null` where calibration is to
    follow), then, for a review adapter, the calibration: a training step of its own, which loads the
    adapter just saved and fits its recover/continue threshold on the data's calibration rows."""
    from train.common.adapter_files import write_adapter_files
    from train.common.calibrate import calibrate_review

    write_adapter_files(output_dir, card, script_args, training_args, model_args)
    if script_args.calibrates(card["decision_types"]):
        calibrate_review(
            output_dir,
            script_args.data,
            script_args.eval_split,
            script_args.calibration_rows,
            script_args.calibration_min_per_label,
        )
