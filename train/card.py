"""What a training run writes next to its adapter: the adapter card `rir_controller.json` (a contract:
`rir_runtime.llm.tuned` validates it before serving the adapter), a Hub model card `README.md` (YAML
front matter: library, base model, tags) and the fully resolved configuration.

The base model is recorded by a name that holds on another machine: a registry name, a hub id, or a
local folder marked as one (`base_model_source`), never rir's model cache path.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.args import AGENT

if TYPE_CHECKING:
    from rir_runtime.llm.tuned import BaseModelRef

RESOLVED_CONFIG = "rir_train_config.json"
README = "README.md"
# The Hub models that registry entries were converted from (the registry serves dequantized GGUF
# copies of them); a Hub card names these, as a registry name means nothing on the Hub.
UPSTREAM_HUB_IDS = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}


def versions() -> dict[str, str]:
    out = {}
    for dist in ("rir", "torch", "transformers", "trl", "peft", "datasets", "accelerate"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def write_card(
    output_dir: str,
    *,
    base_model: str,
    base_model_path: str,
    decision_types: list[str],
    fingerprints: dict[str, str],
    stage: str,
    extra: dict[str, Any] | None = None,
    kind: str | None = None,
) -> Path:
    """`rir_controller.json` (what `rir_runtime.llm.tuned` checks before serving the adapter) and the
    Hub card `README.md` next to it; returns the path of the first. `kind`: `controller` (generative),
    `value` (a scalar head) or `agent`; by default read from the decision types."""
    from rir_runtime.llm.tuned import describe_base
    from rir_runtime.prompts import prompt_format_version

    base = describe_base(base_model)
    kind = kind or (AGENT if decision_types == [AGENT] else "controller")
    card = {
        "kind": kind,
        "base_model": base.name,
        "base_model_source": base.source,
        "base_model_path": base_model_path,
        "decision_types": decision_types,
        "prompt_format_version": prompt_format_version(kind),
        "dataset_fingerprints": fingerprints,
        "trained_with": versions(),
        "stage": stage,
        **(extra or {}),
    }
    path = Path(output_dir) / "rir_controller.json"
    path.write_text(json.dumps(card, indent=2) + "\n")
    (Path(output_dir) / README).write_text(adapter_readme(card, Path(output_dir).name))
    return path


def base_ref(card: dict[str, Any]) -> BaseModelRef:
    """The card's base model and where it comes from (cards written before `base_model_source`: inferred)."""
    from rir_runtime.llm.tuned import BaseModelRef, describe_base

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
        "rir runtime of that version; rir checks `rir_controller.json` before serving it.",
        f"- Use: `rir eval ... {use}`",
        f"- Training data: {', '.join(f'`{d}`' for d in data) or 'not recorded'}",
        f"- Trained with: {', '.join(f'{k} {v}' for k, v in card.get('trained_with', {}).items())}",
        "",
    ]
    return "\n".join(lines)


def write_resolved_config(output_dir: str, script_args: Any, training_args: Any, model_args: Any) -> None:
    """The fully resolved configuration next to the adapter (rerun or audit it later)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    resolved = {"script": asdict(script_args), "training": training_args.to_dict(), "model": asdict(model_args)}
    (Path(output_dir) / RESOLVED_CONFIG).write_text(json.dumps(resolved, indent=2, default=str) + "\n")


def data_build(data: str) -> dict[str, Any]:
    """The `build.json` of the training data (`data` is the build-data folder or one dataset in it),
    or {} (a Hub dataset, or one built elsewhere)."""
    for folder in (Path(data), Path(data).parent):
        path = folder / "build.json"
        if path.is_file():
            return dict(json.loads(path.read_text()))
    return {}


def data_prompt_budget(data: str) -> int | None:
    """The prompt token budget `rir build-data` fitted the training rows to (its `build.json`), or
    None. The card records it so that a `tuned:` controller renders its decisions within the same
    budget it was trained on, not the runtime's longer default."""
    budget = data_build(data).get("config", {}).get("max_prompt_tokens")
    return int(budget) if budget else None


def data_versions(data: str) -> dict[str, int]:
    """The label and controller prompt format versions of the training data (its `build.json`), as
    card fields: `rir eval-controller` refuses to score the adapter on data of other versions. Data
    built before `build.json` recorded them gives none."""
    build = data_build(data)
    versions = {"data_label_version": build.get("label_version")}
    versions["data_prompt_format_version"] = build.get("prompt_format_version")
    return {key: int(value) for key, value in versions.items() if value is not None}


def write_adapter_files(
    output_dir: str, card: dict[str, Any], script_args: Any, training_args: Any, model_args: Any
) -> None:
    """The card and resolved config after training; then, for a review adapter, the calibrated
    threshold. Until calibration writes it, the card says `review_threshold: null`, which a
    `tuned:` controller refuses: a run killed in between cannot be served at an uncalibrated 0."""
    calibrate = script_args.calibrate_review and "review" in card["decision_types"]
    budget = data_prompt_budget(script_args.data)
    extra = {
        **(card.get("extra") or {}),
        **({"max_prompt_tokens": budget} if budget else {}),
        **data_versions(script_args.data),
        **({"review_threshold": None} if calibrate else {}),
    }
    write_card(output_dir, **{**card, "extra": extra})
    write_resolved_config(output_dir, script_args, training_args, model_args)
    if calibrate:
        from train.calibrate import calibrate_review

        calibrate_review(
            output_dir,
            script_args.data,
            script_args.eval_split,
            script_args.calibration_rows,
            script_args.calibration_min_per_label,
        )
