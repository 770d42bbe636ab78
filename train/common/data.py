"""The training datasets: the `rir build-data` folders chosen by `data` and `decision_types`, loaded,
checked (clear errors for a missing folder, split or column, or the wrong kind), mixed, shuffled and
capped, and rows whose prompt alone fills max_length dropped.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_gen.build import COLUMNS
from data_gen.scoring.answers import answer_class
from rir_runtime.errors import UserInputError
from train.common.args import AGENT, DECISION_TYPES, TrainScriptArguments

logger = logging.getLogger(__name__)


def load_dataset_dict(folder: Path) -> Any:
    """The `DatasetDict` of a dataset folder of `rir build-data`, held in memory, or a clear error."""
    from datasets import Dataset, DatasetDict, load_from_disk

    try:
        # In memory: TRL's .map() caches would otherwise be written into the data folder.
        dd = load_from_disk(str(folder), keep_in_memory=True)
    except (FileNotFoundError, ValueError) as err:
        reason = str(err).splitlines()[0]
        raise UserInputError(f"{folder} is not a dataset saved by `rir build-data` ({reason})") from None
    except OSError as err:  # pyarrow's read of a file cut short
        culprit = corrupt_arrow_file(folder) or folder
        raise UserInputError(
            f"{culprit} is corrupt ({str(err).splitlines()[0]}): a file of the dataset was cut short or overwritten; "
            "rebuild it with the same `rir build-data` command (its labels are kept, so it resumes)"
        ) from None
    if isinstance(dd, Dataset):
        raise UserInputError(
            f"{folder} holds one Dataset without splits; it needs a DatasetDict with 'train' and "
            "'validation' splits: rebuild it with `rir build-data`"
        )
    assert isinstance(dd, DatasetDict)
    return dd


def corrupt_arrow_file(folder: Path) -> Path | None:
    """The first of the dataset's Arrow files that cannot be read whole, if any."""
    import pyarrow as pa

    for path in sorted(Path(folder).rglob("*.arrow")):
        try:
            with pa.memory_map(str(path)) as source:
                pa.ipc.open_stream(source).read_all()
        except (OSError, pa.ArrowInvalid):
            return path
    return None


def check_rows(name: str, folder: Path, ds: Any, kind: str) -> None:
    """Column and message-format checks on the first row (the builder writes all rows alike)."""
    have = set(ds.column_names)
    missing = [c for c in COLUMNS[kind] if c not in have]
    if missing:
        other = "pref" if kind == "sft" else "sft"
        if all(c in have for c in COLUMNS[other]):
            cmd = "dpo" if other == "pref" else "sft"
            raise UserInputError(
                f"{folder} is a {'preference' if other == 'pref' else 'SFT'} dataset (columns "
                f"{sorted(have)}); train it with `rir train {cmd}`, or pass the *_{kind} folder"
            )
        raise UserInputError(
            f"dataset {folder} lacks column(s) {missing} (it has {sorted(have)}); "
            f"{kind} training needs {list(COLUMNS[kind])} in TRL's conversational format: "
            "rebuild it with `rir build-data`"
        )
    if len(ds) == 0:
        return
    row = ds[0]
    prompt = row["prompt"]
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt)):
        raise UserInputError(
            f"dataset {folder}: 'prompt' must be a list of chat messages ({{role, content}}); "
            "rebuild it with `rir build-data`"
        )
    for col in COLUMNS[kind][1:]:
        msgs = row[col]
        if not (isinstance(msgs, list) and len(msgs) == 1 and msgs[0].get("role") == "assistant"):
            raise UserInputError(
                f"dataset {folder}: '{col}' must be a list with one assistant message; rebuild it with `rir build-data`"
            )


def dataset_folders(data: str, kind: str, decision_types: Sequence[str]) -> dict[str, Path]:
    """{dataset name: folder}. `data` is the build-data output folder, or one dataset folder."""
    root = Path(data).expanduser()
    if not root.is_dir():
        raise UserInputError(
            f"--data {root} is not a folder: pass the --out folder of `rir build-data` "
            f"(holding {', '.join(f'{t}_{kind}' for t in DECISION_TYPES)}) or one of those folders"
        )
    if (root / "dataset_dict.json").is_file():
        return {root.name: root}
    folders = {f"{t}_{kind}": root / f"{t}_{kind}" for t in decision_types}
    missing = [n for n, f in folders.items() if not f.is_dir()]
    if missing:
        present = sorted(p.name for p in root.iterdir() if (p / "dataset_dict.json").is_file())
        raise UserInputError(
            f"{root} has no dataset folder(s) {missing} (it has: {', '.join(present) or 'none'}); "
            "run `rir build-data --out` into it, or choose decision_types among those present"
        )
    return folders


def decision_types_of(names: Sequence[str]) -> list[str]:
    found = [t for t in (*DECISION_TYPES, AGENT) if any(n.startswith(f"{t}_") for n in names)]
    return found or ["unknown"]


def load_datasets(
    script_args: TrainScriptArguments, kind: str, need_eval: bool, seed: int = 42
) -> tuple[Any, Any | None, dict[str, str], list[str]]:
    """(train, eval or None, {"<name>/<split>": fingerprint}, decision types): the chosen dataset
    folders mixed into one train and one eval set, shuffled, extra columns (meta) dropped."""
    folders = dataset_folders(script_args.data, kind, script_args.decision_types)
    read, fingerprints = read_splits(script_args, folders, kind, need_eval)
    parts: dict[str, list[Any]] = {split: [] for split in read}
    for split, named in read.items():
        for name, ds in named:
            balance = (script_args.balance_review and name.startswith("review_")) or (
                script_args.balance_locate and name.startswith("locate_")
            )
            if balance and split == script_args.train_split:
                ds = balance_labels(ds, seed, name, by_source=script_args.balance_sources)
            parts[split].append(ds.select_columns(list(COLUMNS[kind])))
    if script_args.decision_shares is not None and len(folders) > 1:  # one dataset folder: nothing to mix
        parts[script_args.train_split] = mix_to_shares(
            parts[script_args.train_split], script_args.decision_shares, seed, list(folders)
        )
    train, held_out = shuffled_and_capped(parts, script_args, folders, seed)
    return train, held_out, fingerprints, decision_types_of(list(folders))


def read_splits(
    script_args: TrainScriptArguments, folders: dict[str, Path], kind: str, need_eval: bool
) -> tuple[dict[str, list[tuple[str, Any]]], dict[str, str]]:
    """({split: [(dataset name, its rows)]}, {"<name>/<split>": fingerprint}) of the train split and,
    where wanted, the eval split of every folder, each checked for the columns of `kind`."""
    splits = [script_args.train_split] + ([script_args.eval_split] if need_eval else [])
    read: dict[str, list[tuple[str, Any]]] = {s: [] for s in splits}
    fingerprints: dict[str, str] = {}
    for name, folder in folders.items():
        dd = load_dataset_dict(folder)
        for split in splits:
            if split not in dd:
                fix = ' or set eval_strategy: "no"' if split == script_args.eval_split else ""
                raise UserInputError(
                    f"dataset {folder} has no '{split}' split (it has: {', '.join(dd) or 'none'}); "
                    f"rebuild it with `rir build-data`{fix}"
                )
            check_rows(name, folder, dd[split], kind)
            fingerprints[f"{name}/{split}"] = dd[split]._fingerprint
            read[split].append((name, dd[split]))
    return read, fingerprints


def shuffled_and_capped(
    parts: dict[str, list[Any]], script_args: TrainScriptArguments, folders: dict[str, Path], seed: int
) -> tuple[Any, Any | None]:
    """(train, eval or None): each split's parts concatenated, shuffled and capped at its max samples."""
    from datasets import concatenate_datasets

    out: list[Any] = []
    for split, cap in (
        (script_args.train_split, script_args.max_train_samples),
        (script_args.eval_split, script_args.max_eval_samples),
    ):
        if split not in parts:
            out.append(None)
            continue
        ds = concatenate_datasets(parts[split]).shuffle(seed=seed, keep_in_memory=True)
        if cap is not None:
            ds = ds.select(range(min(cap, len(ds))), keep_in_memory=True)
        if len(ds) == 0:
            raise UserInputError(
                f"the '{split}' split of {', '.join(map(str, folders.values()))} is empty: "
                "generate more rollouts or use other decision_types"
            )
        out.append(ds.flatten_indices(keep_in_memory=True))
    return out[0], out[1]


def resample(rows: list[int], want: int, rng: random.Random) -> list[int]:
    """`want` of `rows`: a sample without repeats when there are enough, else every row and then
    repeats drawn at random."""
    if len(rows) >= want:
        return rng.sample(rows, want)
    return rows + rng.choices(rows, k=want - len(rows))


def balance_labels(ds: Any, seed: int, what: str, by_source: bool = False) -> Any:
    """The rows resampled (with a fixed seed) so that every answer class (`answer_class`) is equally
    frequent and the row count stays the same: the rarer class is repeated, the commoner thinned. A
    review adapter trained on 156 "recover" to 27 "continue" learned to always say "recover"; a
    Where trained on 1 stay row in 8 never stayed. Keeping the count keeps the mix of decisions.

    `by_source`: within a class, every rollout folder (`meta.source_run`) gets an equal share too.
    With the agent's own values on its TextWorld reviews (configs/pipeline/controller_cpu_lesson.yaml)
    they were 18 of 502 "recover" train rows, so a 60-step SFT would see about 2 of them."""
    if "meta" not in ds.column_names or not ds:
        return ds
    by_class: dict[str, dict[str, list[int]]] = {}  # answer class -> rollout folder ("" unless by_source) -> rows
    for i, meta in enumerate(ds["meta"]):
        c = answer_class(meta)
        if c is None:
            return ds  # rows without labels (hand-made data, older locate rows) have nothing to balance
        source = str(meta.get("source_run", "")) if by_source else ""
        by_class.setdefault(c, {}).setdefault(source, []).append(i)
    if len(by_class) < 2 and not by_source:
        return ds
    rng = random.Random(seed)
    per, extra = divmod(len(ds), len(by_class))
    keep: list[int] = []
    for k, c in enumerate(sorted(by_class)):
        groups = by_class[c]
        share, rest = divmod(per + (k < extra), len(groups))
        for j, source in enumerate(sorted(groups)):
            keep += resample(groups[source], share + (j < rest), rng)
    counts = {c: sum(map(len, groups.values())) for c, groups in sorted(by_class.items())}
    per_source = " (and per rollout folder within a class)" if by_source else ""
    logger.warning("%s: resampled %s to %d rows per answer class%s", what, counts, per, per_source)
    return ds.select(sorted(keep), keep_in_memory=True).flatten_indices(keep_in_memory=True)


def mix_to_shares(parts: Sequence[Any], shares: Sequence[float], seed: int, names: Sequence[str]) -> list[Any]:
    """Each decision's train rows resampled (fixed seed) to its share of the total row count, which
    stays the same: the rarer decision is repeated, the commoner thinned. A short run sees only the
    head of the shuffled mix; with the data's own mix 60 steps of 4 rows held ~88 review rows, and
    the When stayed below the step-index reference, while review rows alone taught it."""
    total = sum(len(ds) for ds in parts)
    rng = random.Random(seed)
    out: list[Any] = []
    for ds, share, name in zip(parts, shares, names, strict=True):
        want = round(share * total)
        if want == 0:
            continue
        if not len(ds):
            raise UserInputError(f"decision_shares give {name} {share:.0%} of the rows but it has none")
        keep = resample(list(range(len(ds))), want, rng)
        logger.warning("%s: %d rows resampled to %d (%.0f%% of %d)", name, len(ds), want, 100 * share, total)
        out.append(ds.select(sorted(keep), keep_in_memory=True).flatten_indices(keep_in_memory=True))
    return out


def drop_overlong(ds: Any, tokenizer: Any, max_length: int | None, what: str) -> Any:
    """Drop rows whose prompt alone fills max_length: truncation would leave no completion tokens to
    learn from (and a batch of them gives a NaN loss). Says how many were dropped."""
    if ds is None or not max_length:
        return ds
    keep = [
        i
        for i, p in enumerate(ds["prompt"])
        if len(_ids(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True))) < max_length - 8
    ]
    if len(keep) < len(ds):
        logger.warning(
            "%s: dropped %d of %d rows whose prompt is >= max_length=%d tokens; raise max_length or "
            "rebuild the data with a smaller --max-prompt-tokens",
            what,
            len(ds) - len(keep),
            len(ds),
            max_length,
        )
        if not keep:
            raise UserInputError(f"every {what} prompt is longer than max_length={max_length} tokens: raise max_length")
        ds = ds.select(keep, keep_in_memory=True).flatten_indices(keep_in_memory=True)
    return ds


def _ids(encoded: Any) -> list[int]:
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded
