"""The Hub model card `README.md` of an adapter: YAML front matter (library, base model, tags, datasets)
above what the adapter is and how to use it. Written next to the adapter after training and again,
with the Hub's names, when the adapter is pushed (`train/hub.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rir_runtime.llm.card import CARD, BaseModelRef, describe_base
from train.common.args import AGENT

README = "README.md"
# The Hub models that registry entries were converted from (the registry serves dequantized GGUF
# copies of them); a Hub card names these, as a registry name means nothing on the Hub.
UPSTREAM_HUB_IDS = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}


def base_ref(card: dict[str, Any]) -> BaseModelRef:
    """The card's base model and where it comes from (cards written before `base_model_source`: inferred)."""
    source = card.get("base_model_source")
    return BaseModelRef(card["base_model"], source) if source else describe_base(card["base_model"])


def hub_base_model(card: dict[str, Any]) -> str | None:
    """The base model as the Hub names it: a hub id, a registry entry's upstream id, else the registry
    name; None for a local folder (a path means nothing elsewhere)."""
    base = base_ref(card)
    if base.source == "local":
        return None
    return UPSTREAM_HUB_IDS.get(base.name, base.name) if base.source == "registry" else base.name


def adapter_readme(card: dict[str, Any], title: str, datasets: Sequence[str] = ()) -> str:
    """A Hub model card for the adapter: front matter (library_name, base_model, tags, datasets: Hub
    dataset ids, when the training data was pushed) above what the adapter is and how to use it."""
    from data_gen.cards import front_matter

    agent = card["kind"] == AGENT
    metadata: dict[str, Any] = {"library_name": "peft"}
    hub_base = hub_base_model(card)
    if hub_base:
        metadata["base_model"] = hub_base
    metadata["pipeline_tag"] = "text-generation"
    role = ["agent", "behaviour-cloning"] if agent else ["recovery-controller", *card["decision_types"]]
    metadata["tags"] = ["rir", "lora", "trl", card["stage"], *role]
    if datasets:
        metadata["datasets"] = list(datasets)
    ref = base_ref(card)
    upstream = UPSTREAM_HUB_IDS.get(ref.name) if ref.source == "registry" else None
    where = {"registry": "rir registry model", "hub": "Hub model", "local": "local folder"}[ref.source]
    use = "--policy llm:<folder>" if agent else "--controller tuned:<folder>"
    data = sorted({key.split("/")[0] for key in card.get("dataset_fingerprints", {})})
    lines = [
        front_matter(metadata),
        f"# {title}",
        "",
        f"A LoRA adapter trained by RIR (`rir train {card['stage']}`) as "
        + ("the agent policy." if agent else f"a recovery controller ({', '.join(card['decision_types'])})."),
        "",
        f"- Base model: {where} `{ref.name}`" + (f" (a dequantized GGUF copy of `{upstream}`)" if upstream else ""),
        f"- Prompt format version {card['prompt_format_version']}: the adapter expects prompts rendered by an "
        f"rir runtime of that version; rir checks `{CARD}` before serving it.",
        f"- Use: `rir eval ... {use}`",
        f"- Training data: {', '.join(f'`{d}`' for d in data) or 'not recorded'}",
        f"- Trained with: {', '.join(f'{k} {v}' for k, v in card.get('trained_with', {}).items())}",
        "",
    ]
    return "\n".join(lines)
