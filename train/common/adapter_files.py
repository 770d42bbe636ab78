"""What a training run writes next to its adapter: the adapter card `rir_controller.json` (a contract,
owned by `rir_runtime.llm.card`, which validates it before serving the adapter), a Hub model card
`README.md` (`train/common/model_card.py`) and the fully resolved configuration.

The base model is recorded by a name that holds on another machine: a registry name, a hub id, or a
local folder marked as one (`base_model_source`), never rir's model cache path.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from data_gen.build_record import read_build_record
from rir_runtime.llm.card import CARD, write_card
from train.common.args import AGENT
from train.common.model_card import README, adapter_readme

RESOLVED_CONFIG = "rir_train_config.json"


def write_cards(
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
    """The adapter card `rir_controller.json` (`rir_runtime.llm.card`) and the Hub card `README.md` next
    to it; returns the path of the first. `kind`: `controller` (generative), `value` (a scalar head) or
    `agent`; by default read from the decision types."""
    kind = kind or (AGENT if decision_types == [AGENT] else "controller")
    card = write_card(
        output_dir,
        kind=kind,
        base_model=base_model,
        base_model_path=base_model_path,
        decision_types=decision_types,
        fingerprints=fingerprints,
        stage=stage,
        extra=extra,
    )
    (Path(output_dir) / README).write_text(adapter_readme(card, Path(output_dir).name))
    return Path(output_dir) / CARD


def write_resolved_config(output_dir: str, script_args: Any, training_args: Any, model_args: Any) -> None:
    """The fully resolved configuration next to the adapter (rerun or audit it later)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    resolved = {"script": asdict(script_args), "training": training_args.to_dict(), "model": asdict(model_args)}
    (Path(output_dir) / RESOLVED_CONFIG).write_text(json.dumps(resolved, indent=2, default=str) + "\n")


def data_prompt_budget(data: str) -> int | None:
    """The prompt token budget `rir build-data` fitted the training rows to (its `build.json`), or
    None. The card records it so that a `tuned:` controller renders its decisions within the same
    budget it was trained on, not the runtime's longer default."""
    budget = read_build_record(data).get("config", {}).get("max_prompt_tokens")
    return int(budget) if budget else None


def data_versions(data: str) -> dict[str, int]:
    """The label and controller prompt format versions of the training data (its `build.json`), as
    card fields: `rir eval-controller` refuses to score the adapter on data of other versions. Data
    built before `build.json` recorded them gives none."""
    build = read_build_record(data)
    versions = {"data_label_version": build.get("label_version")}
    versions["data_prompt_format_version"] = build.get("prompt_format_version")
    return {key: int(value) for key, value in versions.items() if value is not None}


def write_adapter_files(
    output_dir: str, card: dict[str, Any], script_args: Any, training_args: Any, model_args: Any
) -> None:
    """The cards and resolved config after training. Where calibration is to follow (`train/common/run.py`), the
    card says `review_threshold: null` until it writes the threshold, which a `tuned:` controller refuses:
    a run killed in between cannot be served at an uncalibrated 0."""
    calibrate = script_args.calibrates(card["decision_types"])
    budget = data_prompt_budget(script_args.data)
    extra = {
        **(card.get("extra") or {}),
        **({"max_prompt_tokens": budget} if budget else {}),
        **data_versions(script_args.data),
        **({"review_threshold": None} if calibrate else {}),
    }
    write_cards(output_dir, **{**card, "extra": extra})
    write_resolved_config(output_dir, script_args, training_args, model_args)
