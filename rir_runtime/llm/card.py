"""The adapter card `rir_controller.json`: the one module that names, writes, reads and checks it.

An adapter folder of `rir train` holds the PEFT adapter, the tokenizer and this card, written at the end
of training (`train/common/adapter_files.py` fills it): what the adapter is (`kind`: controller, value or
agent), which base model it was trained on (by a name that holds on another machine, never rir's model
cache path), which decision types, and the `prompt_format_version` of the renderer that built its
training data. An adapter only works with prompts rendered the same way, so a version mismatch is an
error, not a warning. Calibration adds its review threshold later (`update_card`).

A plain PEFT adapter folder (adapter_config.json and weights, no card; trained elsewhere) is read too:
its card is made from adapter_config.json, with a warning that its prompt format is unknown.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rir_runtime.errors import ModelLoadError, UserInputError
from rir_runtime.llm.registry import MARKER, MODELS, local_path
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

SCALAR, LM = "scalar", "lm"  # the value heads (the card's `value_head`; cards before it: scalar)
VALUE_HEADS = (SCALAR, LM)


def value_head(card: dict[str, Any]) -> str:
    """The card's value head, checked (an unknown one is a card from a newer rir, or a hand edit)."""
    head = str(card.get("value_head", SCALAR))
    if head not in VALUE_HEADS:
        raise UserInputError(f"value adapter card names value_head {head!r}; this rir serves {', '.join(VALUE_HEADS)}")
    return head


def check_adapter_weights(folder: str | Path) -> None:
    """The adapter's weight file, read: a truncated or overwritten file is named as corrupt (it would
    otherwise fail inside PEFT as a model that does not fit, which sends the user after the wrong cause)."""
    from safetensors import safe_open

    for path in sorted(Path(folder).expanduser().glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt") as weights:
                weights.keys()
        except Exception as exc:  # noqa: BLE001 - safetensors' error classes differ by version
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelLoadError(
                f"{path} is corrupt ({why}): the file was cut short or overwritten; copy it again "
                "from where it was trained, or retrain the adapter with the same `rir train` command"
            ) from None


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
    check_prompt_version(card, folder, expect)
    if not card.get("base_model"):
        raise UserInputError(f"{path} names no base_model: retrain the adapter with `rir train sft|dpo`")
    return card


def check_prompt_version(card: dict[str, Any], folder: Path, expect: str) -> None:
    """An adapter only works with prompts rendered as its training data's were: a card of another prompt
    format version than this runtime renders for its kind is refused, not warned about."""
    version, current = card.get("prompt_format_version"), prompt_format_version(expect)
    if version != current:
        verb = {"value": "value", "agent": "agent-sft"}.get(expect, "sft")
        raise UserInputError(
            f"{folder} was trained on {expect} prompts of format version {version}, but this runtime renders "
            f"version {current}: retrain the adapter on data built by this version (`rir build-data` then "
            f"`rir train {verb}`), or use a runtime whose {expect} prompt format is version {version}"
        )


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
    name = card["base_model"]
    if name in MODELS:
        return str(local_path(name))
    recorded = card.get("base_model_path")
    if recorded and Path(recorded).exists():
        return str(recorded)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    return str(name)


# --- writing ----------------------------------------------------------------------------------------
def training_versions() -> dict[str, str]:
    """The versions of the packages that trained an adapter, as its card records them."""
    out = {}
    for dist in ("rir", "torch", "transformers", "trl", "peft", "datasets", "accelerate"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def write_card(
    output_dir: str | Path,
    *,
    kind: str,
    base_model: str,
    base_model_path: str,
    decision_types: list[str],
    fingerprints: dict[str, str],
    stage: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the card of a freshly trained adapter (`kind`: controller, value or agent); returns it. The
    base model is recorded by its shareable name (`describe_base`), its prompt format by the runtime's."""
    base = describe_base(base_model)
    card = {
        "kind": kind,
        "base_model": base.name,
        "base_model_source": base.source,
        "base_model_path": base_model_path,
        "decision_types": decision_types,
        "prompt_format_version": prompt_format_version(kind),
        "dataset_fingerprints": fingerprints,
        "trained_with": training_versions(),
        "stage": stage,
        **(extra or {}),
    }
    (Path(output_dir) / CARD).write_text(json.dumps(card, indent=2) + "\n")
    return card


def update_card(adapter_dir: str | Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge `fields` into the adapter's card (calibration's threshold, say); returns them."""
    path = Path(adapter_dir) / CARD
    card = json.loads(path.read_text())
    path.write_text(json.dumps({**card, **fields}, indent=2) + "\n")
    return fields


def card_as_written(adapter_dir: str | Path) -> dict[str, Any]:
    """The adapter's card as it is on disk, unchecked (`read_card` checks it before an adapter is served)."""
    return dict(json.loads((Path(adapter_dir).expanduser() / CARD).read_text()))


def has_card(folder: str | Path) -> bool:
    """Whether the folder holds an adapter card (an adapter trained by `rir train`)."""
    return (Path(folder).expanduser() / CARD).is_file()


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether the folder holds an adapter: one trained by `rir train` (its card), or a plain PEFT one."""
    path = Path(folder).expanduser()
    return (path / CARD).is_file() or (path / PEFT_CONFIG).is_file()
