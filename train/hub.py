"""Publish what the pipeline made on the Hugging Face Hub: an adapter folder of `rir train` as a
model repository, one dataset folder of `rir build-data` (or the agent data) as a dataset repository.

    push_adapter("runs/sft-quick", "me/rir-controller", private=True, datasets=["me/rir-review-sft"])
    push_dataset("data/controller/review_sft", "me/rir-review-sft", private=True)

Each push is one commit of the folder's files as they are on disk, except what only makes sense on
this machine: training checkpoints and hidden files stay behind, and an adapter's README and
adapter_config.json name the base model by its Hub id instead of a local cache path. Authentication
is huggingface_hub's own (`hf auth login` or $HF_TOKEN).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rir_runtime.errors import UserInputError
from rir_runtime.llm.card import CARD, PEFT_CONFIG, card_as_written

WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
DATASET_DICT = "dataset_dict.json"


@dataclass(frozen=True)
class Upload:
    """One commit to send: the repository and, per path in it, a local file or rewritten content."""

    repo_id: str
    repo_type: str
    files: dict[str, Path | bytes]


# --- what is sent ----------------------------------------------------------------------------------
def shared_files(folder: Path) -> dict[str, Path | bytes]:
    """Every file under `folder` except training checkpoints, hidden files and caches."""
    files: dict[str, Path | bytes] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if rel.parts[0].startswith("checkpoint-") or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        files[rel.as_posix()] = path
    return files


def adapter_upload(folder: str | Path, repo_id: str, datasets: Sequence[str] = ()) -> Upload:
    """An adapter of `rir train`: its files, with a README whose front matter names the Hub base model
    (and `datasets`, Hub ids of the training data) and an adapter_config.json that does too."""
    from train.common.model_card import adapter_readme, hub_base_model

    folder = Path(folder).expanduser()
    if not (folder / PEFT_CONFIG).is_file() or not any((folder / w).is_file() for w in WEIGHTS):
        raise UserInputError(
            f"{folder} is not an adapter folder ({PEFT_CONFIG} and {' or '.join(WEIGHTS)}): "
            "pass the --output_dir of `rir train sft|dpo|agent-sft`"
        )
    if not (folder / CARD).is_file():
        raise UserInputError(
            f"{folder} has no {CARD}: push_adapter publishes adapters trained by `rir train`; push a plain "
            "PEFT adapter with PeftModel.push_to_hub or huggingface_hub's upload_folder"
        )
    card = card_as_written(folder)
    files = shared_files(folder)
    files["README.md"] = adapter_readme(card, repo_id.split("/")[-1], datasets).encode()
    hub_base = hub_base_model(card)
    if hub_base:  # a local folder's path stays: nothing else names that base
        config = json.loads((folder / PEFT_CONFIG).read_text())
        files[PEFT_CONFIG] = (json.dumps({**config, "base_model_name_or_path": hub_base}, indent=2) + "\n").encode()
    return Upload(repo_id, "model", files)


def dataset_upload(folder: str | Path, repo_id: str) -> Upload:
    """One saved `DatasetDict` whose README front matter lists its splits' files (as `rir build-data`
    and the agent data write them), so the Hub and `load_dataset(repo_id)` read it as it is."""
    from huggingface_hub.repocard import metadata_load

    folder = Path(folder).expanduser()
    if not (folder / DATASET_DICT).is_file():
        inside = sorted(p.parent.name for p in folder.glob(f"*/{DATASET_DICT}"))
        hint = f"; it holds the datasets {', '.join(inside)}: push each as {folder}/<name>" if inside else ""
        raise UserInputError(f"{folder} is not a saved dataset (no {DATASET_DICT}){hint}")
    metadata = metadata_load(folder / "README.md") if (folder / "README.md").is_file() else None
    configs = (metadata or {}).get("configs")
    if not configs:
        raise UserInputError(
            f"{folder}/README.md has no dataset-card front matter listing its splits: rebuild it with "
            "`rir build-data` (or `rir train agent-sft --rebuild-data`) of this version"
        )
    for entry in (f for config in configs for f in config.get("data_files", [])):
        if not list(folder.glob(entry["path"])):
            raise UserInputError(
                f"{folder}/README.md lists split '{entry['split']}' at {entry['path']}, but no file matches: "
                "the card does not describe this folder; rebuild the dataset"
            )
    return Upload(repo_id, "dataset", shared_files(folder))


# --- sending -----------------------------------------------------------------------------------------
def send(upload: Upload, *, private: bool, token: str | None = None, message: str = "") -> str:
    """Create the repository if needed and commit the files; returns the commit's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    api.create_repo(upload.repo_id, private=private, repo_type=upload.repo_type, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=data if isinstance(data, bytes) else str(data))
        for name, data in upload.files.items()
    ]
    info: Any = api.create_commit(
        upload.repo_id,
        operations,
        commit_message=message or f"Upload {upload.repo_type} with rir",
        repo_type=upload.repo_type,
    )
    return str(getattr(info, "commit_url", info))


def push_adapter(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = True,
    datasets: Sequence[str] = (),
    token: str | None = None,
) -> str:
    """Publish an adapter folder of `rir train` as model repository `repo_id`; returns the commit URL."""
    return send(adapter_upload(folder, repo_id, datasets), private=private, token=token)


def push_dataset(folder: str | Path, repo_id: str, *, private: bool = True, token: str | None = None) -> str:
    """Publish one dataset folder (e.g. `<build>/review_sft`) as dataset repository `repo_id`."""
    return send(dataset_upload(folder, repo_id), private=private, token=token)
