"""`rir build-data`: rollout folders -> hindsight labels -> Hugging Face datasets in TRL formats.

    rir build-data --rollouts runs/rollout-builtin,runs/rollout-tw --out data/controller

Writes one `DatasetDict` (train / validation; the review datasets also `calibration`) per decision
type under `--out`:
`review_sft`, `locate_sft`, `reflect_sft` (columns `prompt`, `completion`, `meta`) and
`review_pref`, `locate_pref`, `reflect_pref` (`prompt`, `chosen`, `rejected`, `meta`), each with
a README dataset card. Labels are cached in `--out/labels.jsonl` (append-only; a rerun resumes).
Prompts come from `rir_runtime.prompts.fit_decision`, the renderer the controllers use.

A pair differs only in what is judged: both review answers give the same reason (evidence the
prompt shows), and locate pairs set two answers the same prompt offers against each other. Review
and locate rows keep their hindsight values in `meta.values` (checkpoint -> V, JSON) and
`meta.v_now`; reflect rows keep each candidate's retry success in `meta.retry_success`. One set of
held-out task variations serves all six datasets, so train and validation never share one.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from data_gen.build_config import BuildConfig
from data_gen.build_record import write_build_record
from data_gen.hindsight import LABEL_VERSION
from data_gen.labelling import label_episodes
from data_gen.rows import point_meta, rows_for, token_counter
from data_gen.splits import calibration_variations, held_out_variations, split_rows, variation_key, warn_about
from data_gen.value_rows import VALUE_DATASET, value_rows
from rir_runtime.decisions import DecisionKind
from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.output_lock import exclusive_output
from rir_runtime.prompts import DecisionContext, Messages, fit_decision, prompt_format_version
from rir_runtime.trace import READABLE_SCHEMAS, EpisodeRecord, read_records

SFT = ("review_sft", "locate_sft", "reflect_sft")
PREF = ("review_pref", "locate_pref", "reflect_pref")
DATASETS = (*SFT, *PREF, VALUE_DATASET)
# The columns of each format, in TRL's conversational form; every row also keeps its `meta` (docs/contracts.md).
COLUMNS = {"sft": ("prompt", "completion"), "pref": ("prompt", "chosen", "rejected")}


# --- loading runs ---------------------------------------------------------------------------------------
def load_runs(folders: list[str]) -> list[tuple[EpisodeRecord, str]]:
    """(episode, its run folder) for every finished episode, by episode id within a folder; older schemas
    and empty runs get a clear error. Parallel rollout workers write episodes as they finish, so the
    file order changes from run to run; the datasets (and the pairs a seeded shuffle draws from them)
    must not: in file order, two `make demo` runs on one machine trained different value adapters
    (65.0% and 71.7% on the same 60 test episodes)."""
    episodes: list[tuple[EpisodeRecord, str]] = []
    for folder in folders:
        path = Path(folder)
        run = path / "run.json"
        if not run.exists():
            raise UserInputError(f"{path} is not a rollout folder (no run.json): pass folders written by `rir rollout`")
        schema = json.loads(run.read_text()).get("schema")
        if schema not in READABLE_SCHEMAS:
            raise UserInputError(
                f"{path} was written with trace schema {schema}; this version reads {READABLE_SCHEMAS}: "
                f"convert it with `rir trace upgrade {path}` (or regenerate it with `rir rollout`)"
            )
        found = sorted((e for f in path.glob("episodes-*.jsonl") for e in read_records(f)), key=lambda e: e.episode_id)
        if not found:
            raise UserInputError(f"{path} holds no finished episodes: run `rir rollout` into it first")
        episodes += [(e, str(path)) for e in found]
    return episodes


# --- writing -------------------------------------------------------------------------------------------------
def dataset_format(name: str) -> tuple[tuple[str, str], str]:
    """(Hub tags, what the card says) of a dataset's format."""
    if name == VALUE_DATASET:
        return ("preference", "reward-modeling"), "TRL standard preference with an explicit prompt (plain text)"
    if name.endswith("_sft"):
        return ("sft", "prompt-completion"), "TRL conversational prompt-completion"
    return ("preference", "dpo"), "TRL conversational preference"


def dataset_card(
    name: str, splits: dict[str, list[dict]], sources: list[str], cfg: BuildConfig, sides: tuple[int, int]
) -> str:
    """The README of one dataset; `sides` counts the build's train and held-out task variations. Its
    front matter (splits and files, task, license, tags) lets the folder be pushed to the Hub as is."""
    from data_gen.cards import dataset_metadata, front_matter

    fmt, described = dataset_format(name)
    envs = sorted({str(r["meta"]["env"]) for rows in splits.values() for r in rows if r["meta"].get("env")})
    tags = [*fmt, "controller", name.split("_")[0], *envs]
    metadata = dataset_metadata({s: len(r) for s, r in splits.items()}, pretty_name=f"RIR {name}", tags=tags)
    lines = [
        front_matter(metadata),
        f"# {name}",
        "",
        f"Recovery-controller decisions labelled in hindsight by branch re-execution "
        f"(RIR `rir build-data`). Format: {described}.",
        "",
        "| split | rows | task variations | label balance |",
        "| --- | ---: | ---: | --- |",
    ]
    for split, rows in splits.items():
        counts = Counter(r["meta"]["label"] for r in rows)
        balance = ", ".join(f"{k}: {v}" for k, v in counts.most_common(8)) + (" ..." if len(counts) > 8 else "")
        variations = len({variation_key(r["meta"]) for r in rows})
        lines.append(f"| {split} | {len(rows)} | {variations} | {balance} |")
    lines += [
        "",
        "Train and validation never share a task variation, across all datasets of this build "
        f"(one held-out set serves them all, as training mixes them: {sides[0]} task variations on the "
        f"train side, {sides[1]} on the validation side).",
        *(
            [
                "",
                "The rows of every second held-out variation form the `calibration` split: a tuned "
                "controller's recover threshold is fitted there, never on the validation rows it is scored on.",
            ]
            if "calibration" in splits
            else []
        ),
        "",
        "Source runs:",
    ]
    lines += [f"- `{s}`" for s in sources]
    lines += ["", f"Build config: `{json.dumps(asdict(cfg))}`", ""]
    return "\n".join(lines)


def build(cfg: BuildConfig) -> dict[str, dict[str, int]]:
    """Label every run, build the six datasets, save them with cards; returns row counts. The output
    folder is this process's while it runs: a second build into it is refused."""
    with exclusive_output(cfg.out):
        return _build(cfg)


def _build(cfg: BuildConfig) -> dict[str, dict[str, int]]:
    from datasets import Dataset, DatasetDict
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    episodes = load_runs(cfg.rollouts)
    labelled = label_episodes(episodes, cfg, out / "labels.jsonl")
    count = token_counter(cfg.tokenizer)

    def fit(kind: DecisionKind, ctx: DecisionContext) -> Messages:
        return fit_decision(kind, ctx, cfg.max_prompt_tokens, count)

    all_rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for point, label in labelled:
        for name, rows in rows_for(point, label, fit).items():
            all_rows[name] += rows
        monotone = cfg.label_value_of(point.source_run) == "expert"  # V_expert: a bisection's gaps are implied
        all_rows[VALUE_DATASET] += value_rows(point, label, point_meta(point), monotone, cfg.value_pairs_per_point)
    by_dataset = {name: {variation_key(r["meta"]) for r in all_rows.get(name, [])} for name in DATASETS}
    held_out = held_out_variations(by_dataset, cfg.val_fraction)
    every = set().union(*by_dataset.values())
    sides = (len(every - held_out), len(every & held_out))
    calibration = calibration_variations(by_dataset["review_sft"] & held_out)
    counts: dict[str, dict[str, int]] = {}
    for name in DATASETS:
        rows = all_rows.get(name, [])
        if not rows:
            print(f"skipped {name}: no examples (no labelled decision of this kind in the runs)", file=sys.stderr)
            continue
        splits = split_rows(rows, held_out, calibration if name.startswith("review") else None)
        warn_about(name, splits)
        DatasetDict({s: Dataset.from_list(r) for s, r in splits.items() if r}).save_to_disk(str(out / name))
        (out / name / "README.md").write_text(dataset_card(name, splits, cfg.rollouts, cfg, sides))
        counts[name] = {s: len(r) for s, r in splits.items()}
    summary = {
        "config": asdict(cfg),
        # the card of an adapter trained on it keeps both (train/common/adapter_files.py)
        "label_version": LABEL_VERSION,
        "prompt_format_version": prompt_format_version("controller"),
        "value_prompt_version": prompt_format_version("value"),
        "counts": counts,
        "validation_variations": sorted(held_out - calibration),
        "calibration_variations": sorted(calibration),
    }
    write_build_record(out, summary)
    for name, c in counts.items():
        calibrating = f"  calibration {c['calibration']:>5}" if "calibration" in c else ""
        print(f"{name:<13} train {c['train']:>5}  validation {c['validation']:>5}{calibrating}", file=sys.stderr)
    return counts
