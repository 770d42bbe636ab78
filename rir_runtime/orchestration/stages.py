"""Cached, resumable stages: the plumbing under `rir pipeline` and `rir train agent`.

Each stage runs in its own folder and writes `<stage>/stage.json` when it starts (its key, a hash of
its settings and of its inputs' keys, the settings themselves, status "running") and again when it is
done. A rerun skips a done stage whose key matches, and runs an unfinished one again in place: every
stage function resumes from what its folder holds (episodes in append-only JSONL, cached labels,
training checkpoints), so killing a run and starting it again loses no work. A stage whose settings
or inputs changed is cleared and redone, after a line that says what changed. A done stage whose records
(its `*.jsonl` files, fingerprinted when it finished) were torn or edited since is run again in place:
the stage's own resume keeps the intact records and redoes the rest, so no later stage reads a torn one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rir_runtime.cache import file_sha256
from rir_runtime.errors import UserInputError

StageFn = Callable[[Path], object]  # what it returns is ignored: its results are the files in the folder
MARKER = "stage.json"


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists), so recorded and new settings compare equal."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class StageRecord:
    """`<stage>/stage.json`: written when the stage starts (status running) and again when it is done."""

    key: str
    settings: dict[str, Any] | None  # None: written by an older version, which recorded only the key
    inputs: dict[str, str]  # {upstream stage: its key}
    status: str  # "running" or "done"
    wall_s: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)  # {records file: size and sha256} when done

    def changed_outputs(self, folder: Path) -> list[str]:
        """The records files that differ from what the stage left when it finished."""
        now = fingerprints(folder)
        return [name for name, recorded in self.outputs.items() if now.get(name) != recorded]

    @classmethod
    def read(cls, path: Path) -> StageRecord | None:
        """The record, or None when the file is missing or unreadable (a kill while it was written)."""
        try:
            raw = json.loads(path.read_text())
            # the previous version wrote {key, wall_s} once, at the end: such a stage is done
            return cls(
                raw["key"],
                raw.get("settings"),
                raw.get("inputs", {}),
                raw.get("status", "done"),
                raw.get("wall_s", 0.0),
                raw.get("outputs", {}),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)  # atomic: a kill never leaves half a record


def fingerprints(folder: Path) -> dict[str, str]:
    """Each records file of a stage folder (`*.jsonl`, what later stages read) as `<bytes>:<sha256>`."""
    return {path.name: f"{path.stat().st_size}:{file_sha256(path)}" for path in sorted(folder.glob("*.jsonl"))}


def changes(old: Any, new: Any, path: str = "") -> list[str]:
    """What differs between two settings trees, as 'path old -> new' lines (nested keys dotted)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in dict.fromkeys([*old, *new]):
            where = f"{path}.{k}" if path else str(k)
            if k not in old or k not in new:
                out.append(f"{where} {'added' if k in new else 'removed'}")
            else:
                out += changes(old[k], new[k], where)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and old != new:
        return [line for i, (a, b) in enumerate(zip(old, new, strict=True)) for line in changes(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path} {_short(old)} -> {_short(new)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


class Stages:
    """Runs stages in order, each in its own folder under `root`, and never throws work away silently.

    A stage's key hashes its settings and the keys of the stages it reads. A done stage with the same
    key is skipped; an unfinished one (killed) is run again in place, because every stage function
    resumes from what its folder holds; a stage whose settings or inputs changed is cleared first (so
    nothing stale is mixed in), after saying what changed. A folder with files but no readable record
    is refused, not cleared: nothing says a stage made them.
    """

    def __init__(self, root: Path, label: str = "pipeline") -> None:
        self.root = root
        self.label = label
        self.keys: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    def run(self, name: str, settings: dict[str, Any], fn: StageFn, inputs: Sequence[str] = ()) -> Path:
        """Run `fn(folder)` unless its result is already there; `inputs` name stages run before."""
        missing = [i for i in inputs if i not in self.keys]
        if missing:
            raise ValueError(f"stage {name} reads {missing}, which have not run yet")
        settings = _plain(settings)
        upstream = {i: self.keys[i] for i in inputs}
        record = StageRecord(_key(name, settings, upstream), settings, upstream, "running")
        self.keys[name] = record.key
        folder = self.root / name
        old = StageRecord.read(folder / MARKER)
        if old is None or old.key != record.key:
            self._clear(folder, old, record)
        elif torn := old.changed_outputs(folder):
            self._say(f"{name}: {', '.join(torn)} changed after it finished (torn or edited): running it again in "
                      "place, which keeps its intact records")  # fmt: skip
        elif old.status == "done":
            self._say(f"{name}: cached")
            self.timings[name] = old.wall_s
            return folder
        else:
            self._say(f"{name}: resuming an unfinished run")
        folder.mkdir(parents=True, exist_ok=True)
        record.write(folder / MARKER)
        start = time.perf_counter()
        fn(folder)
        self.timings[name] = round(time.perf_counter() - start, 1)
        done = replace(record, status="done", wall_s=self.timings[name], outputs=fingerprints(folder))
        done.write(folder / MARKER)
        return folder

    def _clear(self, folder: Path, old: StageRecord | None, new: StageRecord) -> None:
        """Remove a folder whose contents other settings made, saying which (or why it cannot tell)."""
        name = folder.name
        if not folder.exists() or not {p.name for p in folder.iterdir()} - {Path(MARKER).with_suffix(".tmp").name}:
            self._say(f"{name}: running")
            return
        if old is None:  # files no stage of ours is known to have made: never delete them
            raise UserInputError(
                f"{folder} holds files but no readable {MARKER}, so nothing says which settings made them "
                "(files put there by hand, or a run of an older version): move them elsewhere or delete "
                "the folder, then run again"
            )
        if old.settings is None:
            why = f"its {MARKER} comes from an older version, which recorded no settings to compare"
        else:
            lines = changes(old.settings, new.settings)
            lines += [
                f"its input '{i}' changed"
                for i in dict.fromkeys([*old.inputs, *new.inputs])
                if old.inputs.get(i) != new.inputs.get(i)
            ]
            why = "; ".join(lines) or "its settings changed"
        self._say(f"{name}: {why}: clearing its folder and running it again")
        shutil.rmtree(folder)

    def _say(self, text: str) -> None:
        print(f"[{self.label}] {text}", file=sys.stderr)


def yaml_settings(path: str, what: str) -> dict[str, Any]:
    """A training YAML's keys, for a stage key: edits to its values count, edits to its comments do not."""
    from rir_runtime.orchestration.config import load_yaml

    if not Path(path).is_file():
        raise UserInputError(f"{what} {path} does not exist: fix `{what}` in the YAML (or its flag)")
    return load_yaml(path)
