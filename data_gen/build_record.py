"""`build.json`: what a build of the datasets records next to them. `rir build-data` writes it (its
config, the row counts, the held-out and calibration variations, and the versions of what a label means
and of the prompts the rows were rendered with); training reads it to copy the versions and the prompt
budget into the adapter card, and `rir eval-controller` to refuse an adapter trained on other versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BUILD_RECORD = "build.json"


def write_build_record(out: Path, record: dict[str, Any]) -> None:
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def read_build_record(data: str | Path, or_parent: bool = True) -> dict[str, Any]:
    """The `build.json` of a build folder (or, `or_parent`, of the build a dataset folder `data` belongs
    to); {} where there is none (a Hub dataset, or one built elsewhere or before the record existed)."""
    for folder in (Path(data), Path(data).parent) if or_parent else (Path(data),):
        path = folder / BUILD_RECORD
        if path.is_file():
            return dict(json.loads(path.read_text()))
    return {}
