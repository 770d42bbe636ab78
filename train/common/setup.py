"""The one set-up of a run that trains a LoRA adapter on a causal language model (SFT, DPO, GRPO, the
value model's lm head): the launch checked, the base model resolved (a continued adapter's own base, or
--model), its tokenizer and the datasets prepared once per machine, then the model with its adapter.
A method says only which datasets it reads, which adapter it continues, and which TRL trainer it builds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (tokenizer, whether a held-out set is wanted) -> (train, held-out or None, fingerprints, decision types)
DatasetLoader = Callable[[Any, bool], tuple[Any, Any | None, dict[str, str], list[str]]]


@dataclass
class Setup:
    """What a method's trainer is built from."""

    base_name: str
    base_path: str
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any | None
    fingerprints: dict[str, str]
    decision_types: list[str]
    model: Any
    peft_config: Any | None  # None where the model already carries the adapter it continues

    def trainer_arguments(self, training_args: Any) -> dict[str, Any]:
        """The keyword arguments every TRL trainer of ours takes alike."""
        return dict(
            model=self.model,
            args=training_args,
            train_dataset=self.train_dataset,
            eval_dataset=self.eval_dataset,
            processing_class=self.tokenizer,
            peft_config=self.peft_config,
        )

    def card(self, stage: str, **fields: Any) -> dict[str, Any]:
        """The adapter card's fields of the run (`fields`: the method's own, e.g. `extra`, `kind`)."""
        return dict(
            base_model=self.base_name,
            base_model_path=self.base_path,
            decision_types=self.decision_types,
            fingerprints=self.fingerprints,
            stage=stage,
            **fields,
        )


def wants_eval(training_args: Any) -> bool:
    """Whether the run evaluates on held-out rows (only then are they loaded)."""
    return training_args.eval_strategy != "no" or training_args.eval_on_start


def set_up(
    script_args: Any, training_args: Any, model_args: Any, load: DatasetLoader, start_adapter: str | None = None
) -> Setup:
    """The run's base model, tokenizer, datasets and trainable model. With `start_adapter` the model
    carries that adapter, trainable, on the base model it was trained on; else a fresh LoRA adapter."""
    from train.common.distributed import check_launch, main_process_first
    from train.common.models import load_tokenizer, resolve_start, trainable_model

    check_launch(training_args)
    with main_process_first(training_args, "preparing the model and datasets"):
        base_name, base_path = resolve_start(script_args, model_args)
        tokenizer = load_tokenizer(start_adapter or base_path)
        train_ds, eval_ds, fingerprints, types = load(tokenizer, wants_eval(training_args))
    model, peft_config = trainable_model(
        base_name, base_path, start_adapter, model_args, training_args, script_args.lora_top_layers
    )
    return Setup(base_name, base_path, tokenizer, train_ds, eval_ds, fingerprints, types, model, peft_config)


def prompt_completion_datasets(script_args: Any, training_args: Any, kind: str) -> DatasetLoader:
    """The loader of the `*_sft` (kind `sft`) or `*_pref` (`pref`) datasets, rows whose prompt alone
    fills max_length dropped."""
    from train.common.data import drop_overlong, load_datasets

    def load(tokenizer: Any, need_eval: bool) -> tuple[Any, Any | None, dict[str, str], list[str]]:
        train_ds, eval_ds, fingerprints, types = load_datasets(script_args, kind, need_eval, training_args.seed)
        max_length = training_args.max_length
        return (
            drop_overlong(train_ds, tokenizer, max_length, "train"),
            drop_overlong(eval_ds, tokenizer, max_length, "eval"),
            fingerprints,
            types,
        )

    return load
