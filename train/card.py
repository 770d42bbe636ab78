"""What a training run writes next to its adapter: the adapter card `rir_controller.json` (a contract:
`rir_runtime.llm.tuned` validates it before serving the adapter) and the fully resolved configuration.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from train.args import AGENT

RESOLVED_CONFIG = "rir_train_config.json"


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
) -> Path:
    """`rir_controller.json`: what `rir_runtime.llm.tuned` checks before serving the adapter."""
    from rir_runtime.prompts import PROMPT_FORMAT_VERSION

    card = {
        "kind": AGENT if decision_types == [AGENT] else "controller",
        "base_model": base_model,
        "base_model_path": base_model_path,
        "decision_types": decision_types,
        "prompt_format_version": PROMPT_FORMAT_VERSION,
        "dataset_fingerprints": fingerprints,
        "trained_with": versions(),
        "stage": stage,
        **(extra or {}),
    }
    path = Path(output_dir) / "rir_controller.json"
    path.write_text(json.dumps(card, indent=2) + "\n")
    return path


def write_resolved_config(output_dir: str, script_args: Any, training_args: Any, model_args: Any) -> None:
    """The fully resolved configuration next to the adapter (rerun or audit it later)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    resolved = {"script": asdict(script_args), "training": training_args.to_dict(), "model": asdict(model_args)}
    (Path(output_dir) / RESOLVED_CONFIG).write_text(json.dumps(resolved, indent=2, default=str) + "\n")
