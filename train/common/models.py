"""The base model of a training run: its name resolved through the registry, the model and tokenizer
loaded, and the configured LoRA targets checked against it (a wrong name gets the list of the model's
linear layers, which is what `lora_target_modules` can name). DPO and GRPO may start from an SFT
adapter instead of a fresh LoRA adapter: it must sit on the same base model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from rir_runtime.errors import UserInputError
from train.common.args import TrainScriptArguments


def resolve_base(script_args: TrainScriptArguments, model_args: Any) -> tuple[str, str]:
    """(name as given, local path or hub id) of the base model; the registry prepares packaged models."""
    from rir_runtime.llm.registry import local_path

    name = script_args.model or model_args.model_name_or_path
    if not name:
        raise UserInputError(
            "no base model: pass --model (a registry name such as smollm2-135m-instruct, "
            "a local folder or a hub id) or set `model:` in the config"
        )
    model_args.model_name_or_path = str(local_path(name))
    return name, model_args.model_name_or_path


def resolve_start(script_args: Any, model_args: Any) -> tuple[str, str]:
    """(base name, base path) of a run. A run that continues `sft_adapter` trains on that adapter's
    base model unless --model names another, which must then be the same."""
    from rir_runtime.llm.card import read_card

    adapter = getattr(script_args, "sft_adapter", None)
    card = read_card(adapter) if adapter else None
    if card and not script_args.model and not model_args.model_name_or_path:
        script_args.model = card["base_model"]
    base_name, base_path = resolve_base(script_args, model_args)
    if adapter and card:
        check_same_base(card, adapter, base_name, base_path)
    return base_name, base_path


def check_same_base(card: dict, adapter: str, base_name: str, base_path: str) -> None:
    """The SFT adapter must sit on the base model we load (else the LoRA shapes or meaning differ)."""
    from rir_runtime.llm.card import base_model_location

    if card["base_model"] == base_name or Path(base_model_location(card)).resolve() == Path(base_path).resolve():
        return
    raise UserInputError(
        f"sft_adapter {adapter} was trained on base model '{card['base_model']}', but the model "
        f"is '{base_name}': drop --model (the adapter's base is used) or pass "
        f"--model {card['base_model']}"
    )


def trainable_model(
    base_name: str,
    base_path: str,
    sft_adapter: str | None,
    model_args: Any,
    training_args: Any,
    top_layers: int | None = None,
) -> tuple[Any, Any]:
    """(model, peft_config for the trainer). With `sft_adapter` the base model carries that adapter,
    trainable (TRL then keeps a frozen copy as the reference, and needs no peft_config); otherwise
    the trainer adds a fresh LoRA adapter from the config's LoRA keys."""
    model = load_base_model(base_path, model_args, training_args)
    if sft_adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, sft_adapter, is_trainable=True), None
    model_args.use_peft = True  # we always train a LoRA adapter; LoRA settings come from ModelConfig
    return model, lora_config(model, model_args, base_name, top_layers)


def load_base_model(path: str, model_args: Any, training_args: Any) -> Any:
    """The base causal LM, loaded the way TRL loads one from a name (dtype, attention kernel)."""
    from trl.trainer.utils import create_model_from_path

    kwargs: dict[str, Any] = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype or "auto",
        device_map=None,
    )  # the Trainer (or accelerate under DDP/FSDP) places it
    kwargs.update(training_args.model_init_kwargs or {})
    try:
        return create_model_from_path(path, **kwargs)
    except OSError as err:
        raise UserInputError(f"cannot load base model {path}: {str(err).splitlines()[0]}") from None


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise UserInputError(
            f"the tokenizer of {path} has no chat template; controller prompts are chat messages. "
            "Use an instruct model, or a registry model (which gets a default template)"
        )
    return tokenizer


def linear_module_names(model: Any) -> list[str]:
    """Leaf names of the model's linear layers (what `lora_target_modules` can name)."""
    import torch

    kinds: tuple[type, ...] = (torch.nn.Linear,)
    with contextlib.suppress(ImportError):
        from transformers.pytorch_utils import Conv1D

        kinds += (Conv1D,)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, kinds) and n})


def lora_config(model: Any, model_args: Any, base_name: str, top_layers: int | None = None) -> Any:
    """The trainer's LoRA config from the ModelConfig keys, its targets checked against the model; with
    `top_layers`, on the top N decoder layers only, so the backward pass need not reach below them."""
    from trl import get_peft_config

    peft_config: Any = get_peft_config(model_args)
    check_lora_targets(model, peft_config, base_name)
    if top_layers is not None:
        n_layers = int(model.config.num_hidden_layers)
        if not 1 <= top_layers <= n_layers:
            raise UserInputError(
                f"lora_top_layers {top_layers} is not between 1 and the {n_layers} layers of {base_name}: "
                "fix it, or leave it unset for LoRA on every layer"
            )
        peft_config.layers_to_transform = list(range(n_layers - top_layers, n_layers))
    return peft_config


def check_lora_targets(model: Any, peft_config: Any, model_name: str) -> None:
    """Every named target must be a module of the model; else list the linear layers it does have."""
    targets = getattr(peft_config, "target_modules", None)
    if targets is None or isinstance(targets, str):  # PEFT defaults, 'all-linear', or a regex
        return
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserInputError(
            f"lora_target_modules {sorted(missing)} are not modules of {model_name}. Its linear layers are: "
            f"{', '.join(linear_module_names(model))}. Fix lora_target_modules (or use all-linear)."
        )
