"""Tuned backends: a base model plus a LoRA adapter trained by `rir train` (`tuned:<adapter-folder>`).

An adapter folder holds the PEFT adapter, the tokenizer, and `rir_controller.json` (the card
written at the end of training, `train/card.py`): what it is (`kind`), which base model it was trained on, which
decision types, and the `prompt_format_version` of the renderer that built its training data. A
controller adapter only works with prompts rendered the same way, so a version mismatch is an
error, not a warning.

A plain PEFT adapter folder (adapter_config.json and weights, no card; trained elsewhere) loads too:
its base model is read from adapter_config.json, with a warning that its prompt format is unknown.

    backend = load_tuned_backend("runs/sft-smollm2")        # base + adapter, LoRA merged into the weights
    backend.generate([messages], max_new_tokens=160)
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rir_runtime.errors import ModelLoadError, UserInputError
from rir_runtime.llm.backends import TransformersBackend, default_device, set_num_threads
from rir_runtime.prompts import prompt_format_version

CARD = "rir_controller.json"
PEFT_CONFIG = "adapter_config.json"
# How to use adapters of other kinds (written by other training stages), for the error message.
KIND_USE = {
    "policy": "the agent policy: --policy llm:{dir}",
    "agent": "the agent policy: --policy llm:{dir}",
    "controller": "a recovery controller: --controller tuned:{dir}",
    "value": "a value controller: --controller value:{dir}",
}


def read_card(adapter_dir: str | Path, expect: str = "controller") -> dict[str, Any]:
    """The adapter's `rir_controller.json`, validated: an adapter of the `expect`ed kind (controller or
    agent) with our prompt format. A plain PEFT folder gets a card made from its adapter_config.json."""
    folder = Path(adapter_dir).expanduser()
    if not folder.is_dir():
        raise UserInputError(f"adapter folder {folder} does not exist: pass the --output-dir of `rir train sft|dpo`")
    path = folder / CARD
    if not path.is_file() and (folder / PEFT_CONFIG).is_file():
        return plain_adapter_card(folder, expect)
    if not path.is_file():
        raise UserInputError(
            f"{folder} has no {CARD} and no {PEFT_CONFIG}, so it is not an adapter folder. "
            f"Train one with `rir train sft --config configs/train/sft_cpu_quick.yaml`."
        )
    try:
        card = json.loads(path.read_text())
    except ValueError as err:
        raise UserInputError(f"{path} is not valid JSON ({err}): retrain the adapter or restore the file") from None
    kind = card.get("kind")
    if kind != expect:
        use = KIND_USE.get(str(kind), f"whatever stage produced it, not as a {expect}").format(dir=folder)

        def a(word: object) -> str:
            return f"an {word}" if str(word)[:1] in "aeiou" else f"a {word}"

        raise UserInputError(f"{folder} is {a(kind)} adapter, not {a(expect)} adapter; use it as {use} instead")
    version, current = card.get("prompt_format_version"), prompt_format_version(expect)
    if version != current:
        raise UserInputError(
            f"{folder} was trained on {expect} prompts of format version {version}, but this runtime renders "
            f"version {current}: retrain the adapter on data built by this version (`rir build-data` then "
            f"`rir train sft`), or use a runtime whose {expect} prompt format is version {version}"
        )
    if not card.get("base_model"):
        raise UserInputError(f"{path} names no base_model: retrain the adapter with `rir train sft|dpo`")
    return card


class PlainAdapterWarning(UserWarning):
    """A PEFT adapter without rir's card is served, but nothing says which prompts it was trained on."""


def plain_adapter_card(folder: Path, expect: str) -> dict[str, Any]:
    """A card for a PEFT adapter trained elsewhere: the base model from its adapter_config.json; the
    prompt format is unknown, so it is served with a warning instead of the version check."""
    path = folder / PEFT_CONFIG
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise UserInputError(f"{path} is not valid JSON ({err}): re-save the adapter with PEFT") from None
    recorded = config.get("base_model_name_or_path")
    if not recorded:
        raise UserInputError(
            f"{path} names no base_model_name_or_path, so the base model of {folder} is unknown: "
            "add it to adapter_config.json (a hub id, a registry name or a local folder)"
        )
    warnings.warn(
        f"{folder} is a plain PEFT adapter (no {CARD}): it was not trained by `rir train`, so its prompt "
        f"format is unknown; it is used as {'an' if expect[:1] in 'aeiou' else 'a'} {expect} on rir's "
        f"prompts (format version {prompt_format_version(expect)}) as they are",
        PlainAdapterWarning,
        stacklevel=3,
    )
    base = describe_base(str(recorded))
    return {
        "kind": expect,
        "base_model": base.name,
        "base_model_source": base.source,
        "base_model_path": str(recorded),
        "decision_types": [],
        "prompt_format_version": None,
        "stage": "peft",
        "plain_peft": True,
    }


@dataclass(frozen=True)
class BaseModelRef:
    """How a base model is named where it is shared: a registry name, a hub id, or a local folder."""

    name: str
    source: Literal["registry", "hub", "local"]


HF_CACHE_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/")


def describe_base(name_or_path: str) -> BaseModelRef:
    """The shareable name of a base model. A machine's cache path is not one: a folder of rir's model
    cache becomes its registry name (also one recorded on another machine: `.../models/<registered
    name>` that is not another folder here), a Hugging Face hub snapshot becomes its hub id; any other
    folder stays a local folder."""
    from rir_runtime.llm.registry import MARKER, MODELS

    if name_or_path in MODELS:
        return BaseModelRef(name_or_path, "registry")
    path = Path(name_or_path).expanduser()
    if path.name in MODELS and path.parent.name == "models" and (not path.exists() or (path / MARKER).is_file()):
        return BaseModelRef(path.name, "registry")
    snapshot = HF_CACHE_SNAPSHOT.search(path.as_posix())
    if snapshot:
        return BaseModelRef(f"{snapshot[1]}/{snapshot[2]}", "hub")
    if path.is_dir() or name_or_path.startswith(("/", ".", "~")):
        return BaseModelRef(str(path.resolve()), "local")
    return BaseModelRef(name_or_path, "hub")


def base_model_location(card: dict[str, Any]) -> str:
    """Where to load the base from: a registered name is re-resolved (the cache path may differ
    between machines); else the recorded path if it exists here; else the name (a hub id)."""
    from rir_runtime.llm.registry import MODELS, local_path

    name = card["base_model"]
    if name in MODELS:
        return str(local_path(name))
    recorded = card.get("base_model_path")
    if recorded and Path(recorded).exists():
        return str(recorded)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    return str(name)


def load_tuned_model(
    adapter_dir: str | Path, merge: bool = False, device: str = "cpu", dtype: Any = "auto", expect: str = "controller"
) -> tuple[Any, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, card): the base model with the adapter applied (or merged)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    card = read_card(adapter_dir, expect)
    folder = Path(adapter_dir).expanduser()
    where = base_model_location(card)
    if dtype in (None, "auto"):
        dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    # a value adapter sits on the base with a scalar head (its trained copy is saved in the adapter)
    head = {"num_labels": 1} if expect == "value" else {}
    model_class = AutoModelForSequenceClassification if expect == "value" else AutoModelForCausalLM
    try:
        with quiet_loading():  # a value adapter's base lacks the head the adapter brings: not news
            base = model_class.from_pretrained(where, dtype=dtype, **head)
    except Exception as exc:  # noqa: BLE001 - one clear line
        raise ModelLoadError(
            f"cannot load the base model '{card['base_model']}' ({where}) of adapter {folder}: {_first_line(exc)}"
        ) from None
    try:
        model = PeftModel.from_pretrained(base, str(folder))
    except Exception as exc:  # noqa: BLE001 - shape/module mismatches become one clear line
        raise ModelLoadError(
            f"adapter {folder} does not fit base model '{card['base_model']}' ({where}): "
            f"{_first_line(exc)}. Was the base model changed after training?"
        ) from None
    if merge:
        model = model.merge_and_unload()
    # The adapter folder's tokenizer is the one training used (same chat template, pad token set).
    tok_src = folder if (folder / "tokenizer_config.json").is_file() else Path(where)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_src))
    return model.to(device).eval(), tokenizer, card


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' loading report (newly initialised or unexpected weights) left unprinted."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


class TunedBackend(TransformersBackend):
    """`TransformersBackend` over base model + adapter: same batching, chat template, stop strings,
    scoring and constrained decoding; it adds the adapter's card (what the adapter was trained for)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str,
        card: dict[str, Any],
        device: str = "cpu",
        max_batch_size: int = 16,
    ) -> None:
        super().__init__(model, tokenizer, name, device, max_batch_size)
        self.card = card


def load_tuned_backend(
    adapter_dir: str,
    merge: bool = True,
    device: str | None = None,
    dtype: Any = "auto",
    max_batch_size: int = 16,
    num_threads: int | None = None,
    expect: str = "controller",
) -> TunedBackend:
    """A `TunedBackend` serving base model + adapter, after its card is checked.

    The controller passes chat messages; the backend applies the tokenizer's chat template, so the
    served prompt is the one the adapter was trained on. LoRA is folded into the weights by default:
    on a 2-core CPU a reflection then takes 6.8 s instead of 8.0 s and a ranked review 0.86 s instead
    of 1.17 s (the demo's adapter), deciding the same up to float rounding; `merge=False`
    keeps base and adapter apart. A `tuned:` prefix is accepted.
    """
    set_num_threads(num_threads)
    adapter_dir = adapter_dir.removeprefix("tuned:")
    device = device or default_device()
    model, tokenizer, card = load_tuned_model(adapter_dir, merge=merge, device=device, dtype=dtype, expect=expect)
    return TunedBackend(model, tokenizer, f"tuned:{adapter_dir}", card, device, max_batch_size)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
