"""`rir build-data`: rollout folders -> hindsight labels -> Hugging Face datasets in TRL formats.

    rir build-data --rollouts runs/rollout-builtin,runs/rollout-tw --out data/controller

Writes one `DatasetDict` (train / validation) per decision type under `--out`:
`review_sft`, `locate_sft`, `reflect_sft` (columns `prompt`, `completion`, `meta`) and
`review_pref`, `locate_pref`, `reflect_pref` (`prompt`, `chosen`, `rejected`, `meta`), each with
a README dataset card. Labels are cached in `--out/labels.jsonl` (append-only; a rerun resumes).
Prompts come from `rir_runtime.prompts.fit_decision`, the renderer the controllers use.
"""

from __future__ import annotations

import json
import sys
import warnings
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from data_gen.hindsight import (
    DecisionPoint,
    Label,
    context_for,
    decision_points,
    label_point,
    reflection_candidates,
    retry_success,
)
from data_gen.rollout import SCHEMA_VERSION
from rir_runtime.decisions import Reflection, Review, dump, parse
from rir_runtime.envs import make_env
from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.jobs import read_episodes
from rir_runtime.prompts import Messages, approx_tokens, fit_decision

SFT = ("review_sft", "locate_sft", "reflect_sft")
PREF = ("review_pref", "locate_pref", "reflect_pref")


@dataclass
class BuildConfig:
    rollouts: list[str] = field(default_factory=list, metadata={"help": "comma list of rollout run folders"})
    out: str = field(default="data/controller", metadata={"help": "output folder for the datasets"})
    max_prompt_tokens: int = field(default=1536, metadata={"help": "cut trajectories from the middle beyond this"})
    tokenizer: str = field(
        default="", metadata={"help": "model whose tokenizer counts tokens (default: ~4 chars/token)"}
    )
    bisect: bool = field(default=True, metadata={"help": "find restore points by bisection (irreversible errors)"})
    reflect_retries: int = field(default=2, metadata={"help": "K retries per candidate reflection"})
    reflect_points: int = field(default=1, metadata={"help": "recoveries per episode given reflection preferences"})
    points_per_episode: int = field(default=4, metadata={"help": "reviews labelled per episode (latest first)"})
    val_fraction: float = field(default=0.2, metadata={"help": "share of task variations held out for validation"})

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("rollouts is empty: pass --rollouts DIR[,DIR...]")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError("val_fraction must be within (0, 1)")


# --- loading runs ---------------------------------------------------------------------------------------
def load_runs(folders: list[str]) -> list[dict[str, Any]]:
    """Episodes of every run folder; older schemas and empty runs get a clear error."""
    episodes: list[dict[str, Any]] = []
    for folder in folders:
        path = Path(folder)
        run = path / "run.json"
        if not run.exists():
            raise UserInputError(f"{path} is not a rollout folder (no run.json): pass folders written by `rir rollout`")
        schema = json.loads(run.read_text()).get("schema")
        if schema != SCHEMA_VERSION:
            raise UserInputError(
                f"{path} was written with schema {schema}; this version reads {SCHEMA_VERSION}: "
                "regenerate it with `rir rollout`"
            )
        found = [e for f in sorted(path.glob("episodes-*.jsonl")) for e in read_episodes(f)]
        if not found:
            raise UserInputError(f"{path} holds no finished episodes: run `rir rollout` into it first")
        for e in found:
            e["source_run"] = str(path)
        episodes += found
    return episodes


def variation_key(meta: dict[str, Any]) -> str:
    return f"{meta['env']}/{meta['task']}/{meta['split']}/{meta['variation']}"


def validation_variations(keys: set[str], fraction: float) -> set[str]:
    """A deterministic share of task variations held out: never on both sides of the split."""
    ranked = sorted(keys, key=lambda k: zlib.crc32(k.encode()))
    n_val = max(1, round(fraction * len(ranked))) if len(ranked) > 1 else 0
    return set(ranked[:n_val])


# --- labelling (cached) ------------------------------------------------------------------------------------
def point_id(point: DecisionPoint, i: int) -> str:
    return f"{point.episode['episode_id']}#review{i}"


def label_to_json(pid: str, label: Label) -> dict[str, Any]:
    return {
        "point_id": pid,
        "values": {str(k): v for k, v in label.values.items()},
        "v_now": label.v_now,
        "review": label.review,
        "restore": label.restore,
        "segment": label.segment,
        "segments": [list(s) for s in label.segments],
        "env_steps": label.env_steps,
        "probes": label.probes,
        "reflections": [[r.to_json(), rate] for r, rate in label.reflections],
    }


def label_episodes(episodes: list[dict[str, Any]], cfg: BuildConfig, cache: Path) -> list[tuple[DecisionPoint, dict]]:
    """Label the latest `points_per_episode` reviews of each episode; resumes from `cache`."""
    from tqdm import tqdm

    done = {r["point_id"]: r for r in read_episodes(cache)} if cache.exists() else {}
    envs: dict[str, Any] = {}
    out: list[tuple[DecisionPoint, dict]] = []
    with cache.open("a") as fh:
        for episode in tqdm(episodes, desc="labelling", unit="ep", file=sys.stderr):
            points = list(enumerate(decision_points(episode)))[-cfg.points_per_episode :]
            reflected = 0
            for i, point in points:
                pid = point_id(point, i)
                if pid not in done:
                    env = envs.get(episode["env"]) or envs.setdefault(episode["env"], make_env(episode["env"]))
                    try:
                        label = label_point(env, point, bisect=cfg.bisect)
                    except RIRError as err:
                        warnings.warn(f"skipping {pid}: {err}", stacklevel=2)
                        continue
                    if label.restore is not None and label.review == "recover" and reflected < cfg.reflect_points:
                        reflected += 1
                        rate = episode.get("error_rate", 0.15)
                        label.reflections = [
                            (c, retry_success(env, label, c, cfg.reflect_retries, rate))
                            for c in reflection_candidates(label)
                        ]
                    done[pid] = label_to_json(pid, label)
                    fh.write(json.dumps(done[pid]) + "\n")
                    fh.flush()
                out.append((point, done[pid]))
    for env in envs.values():
        env.close()
    return out


# --- rows --------------------------------------------------------------------------------------------------
def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def rows_for(point: DecisionPoint, label: dict[str, Any], fit: Any) -> dict[str, list[dict[str, Any]]]:
    """All SFT and preference rows one labelled decision point yields."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ep = point.episode
    meta = {
        "env": ep["env"],
        "task": ep["task"],
        "split": ep["split"],
        "variation": int(ep["variation"]),
        "episode_id": ep["episode_id"],
        "step": len(point.history),
        "source_run": ep.get("source_run", ""),
        "decision": "review",
    }
    ctx = context_for(point)
    recover = label["review"] == "recover"
    reason = (
        f"success is still possible from checkpoint {label['restore']}"
        if recover
        else "no earlier checkpoint does clearly better"
    )
    good = dump("review", Review(label["review"], reason))
    bad = dump("review", Review("continue" if recover else "recover", "" if recover else "something went wrong"))
    prompt = fit("review", ctx)
    meta_review = {**meta, "label": label["review"], "context": ctx.to_json()}
    rows["review_sft"].append({"prompt": prompt, "completion": _assistant(good), "meta": meta_review})
    rows["review_pref"].append(
        {"prompt": prompt, "chosen": _assistant(good), "rejected": _assistant(bad), "meta": meta_review}
    )
    r, seg = label["restore"], label["segment"]
    if recover and r is not None:
        segs = tuple(tuple(s) for s in label["segments"])
        ctx_c = context_for(point, "locate", segments=segs)
        p_coarse = fit("locate_coarse", ctx_c)
        rows["locate_sft"].append(
            {
                "prompt": p_coarse,
                "completion": _assistant(dump("locate_coarse", seg)),
                "meta": {**meta, "label": str(seg), "decision": "locate_coarse", "context": ctx_c.to_json()},
            }
        )
        ctx_f = context_for(point, "locate", segments=segs, segment=segs[seg])
        p_fine = fit("locate_fine", ctx_f)
        meta_fine = {**meta, "label": str(r), "decision": "locate_fine", "context": ctx_f.to_json()}
        rows["locate_sft"].append(
            {"prompt": p_fine, "completion": _assistant(dump("locate_fine", r)), "meta": meta_fine}
        )
        wrong = point.chosen_step if point.chosen_step not in (None, r) else (r + 1 if r + 1 < segs[-1][1] else r - 1)
        if wrong is not None and wrong >= 0 and wrong != r:
            rows["locate_pref"].append(
                {
                    "prompt": p_fine,
                    "chosen": _assistant(dump("locate_fine", r)),
                    "rejected": _assistant(dump("locate_fine", wrong)),
                    "meta": meta_fine,
                }
            )
    if label["reflections"]:
        ranked = sorted(label["reflections"], key=lambda x: -x[1])  # stable: hindsight before "none" on ties
        ctx_r = context_for(point, "reflect", restore_point=r)
        p_reflect = fit("reflect", ctx_r)
        best = parse("reflect", json.dumps(ranked[0][0]))
        meta_reflect = {**meta, "decision": "reflect", "context": ctx_r.to_json()}
        rows["reflect_sft"].append(
            {
                "prompt": p_reflect,
                "completion": _assistant(dump("reflect", best)),
                "meta": {**meta_reflect, "label": f"{ranked[0][1]:.2f}"},
            }
        )
        if ranked[0][1] > ranked[-1][1]:
            worst = parse("reflect", json.dumps(ranked[-1][0])) if ranked[-1][0] else Reflection()
            rows["reflect_pref"].append(
                {
                    "prompt": p_reflect,
                    "chosen": _assistant(dump("reflect", best)),
                    "rejected": _assistant(dump("reflect", worst)),
                    "meta": {**meta_reflect, "label": f"{ranked[0][1]:.2f}>{ranked[-1][1]:.2f}"},
                }
            )
    return rows


def token_counter(tokenizer_name: str) -> Any:
    if not tokenizer_name:
        return approx_tokens
    from rir_runtime.llm.registry import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    return lambda messages: len(tok.apply_chat_template(messages, tokenize=True))


# --- writing -------------------------------------------------------------------------------------------------
def dataset_card(name: str, splits: dict[str, list[dict]], sources: list[str], cfg: BuildConfig) -> str:
    lines = [
        f"# {name}",
        "",
        f"Recovery-controller decisions labelled in hindsight by branch re-execution "
        f"(RIR `rir build-data`). Format: TRL conversational "
        f"{'prompt-completion' if name.endswith('_sft') else 'preference'}.",
        "",
        "| split | rows | label balance |",
        "| --- | ---: | --- |",
    ]
    for split, rows in splits.items():
        counts = Counter(r["meta"]["label"] for r in rows)
        balance = ", ".join(f"{k}: {v}" for k, v in counts.most_common(8)) + (" ..." if len(counts) > 8 else "")
        lines.append(f"| {split} | {len(rows)} | {balance} |")
    lines += ["", "Train and validation never share a task variation.", "", "Source runs:"]
    lines += [f"- `{s}`" for s in sources]
    lines += ["", f"Build config: `{json.dumps(asdict(cfg))}`", ""]
    return "\n".join(lines)


def build(cfg: BuildConfig) -> dict[str, dict[str, int]]:
    """Label every run, build the six datasets, save them with cards; returns row counts."""
    from datasets import Dataset, DatasetDict
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    episodes = load_runs(cfg.rollouts)
    labelled = label_episodes(episodes, cfg, out / "labels.jsonl")
    count = token_counter(cfg.tokenizer)

    def fit(kind: str, ctx: Any) -> Messages:
        return fit_decision(kind, ctx, cfg.max_prompt_tokens, count)  # type: ignore[arg-type]

    all_rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for point, label in labelled:
        for name, rows in rows_for(point, label, fit).items():
            all_rows[name] += rows
    keys = {variation_key(r["meta"]) for rows in all_rows.values() for r in rows}
    held_out = validation_variations(keys, cfg.val_fraction)
    counts: dict[str, dict[str, int]] = {}
    for name in SFT + PREF:
        rows = all_rows.get(name, [])
        splits = {
            "train": [r for r in rows if variation_key(r["meta"]) not in held_out],
            "validation": [r for r in rows if variation_key(r["meta"]) in held_out],
        }
        if not rows:
            print(f"skipped {name}: no examples (no labelled decision of this kind in the runs)", file=sys.stderr)
            continue
        labels = Counter(r["meta"]["label"] for r in rows)
        if name.startswith("review") and len(labels) < 2:
            print(
                f"warning: {name} has only the label {next(iter(labels))!r}; a controller cannot learn "
                "both decisions from it (add exploratory rollouts or more tasks)",
                file=sys.stderr,
            )
        DatasetDict({s: Dataset.from_list(r) for s, r in splits.items() if r}).save_to_disk(str(out / name))
        (out / name / "README.md").write_text(dataset_card(name, splits, cfg.rollouts, cfg))
        counts[name] = {s: len(r) for s, r in splits.items()}
    (out / "build.json").write_text(json.dumps({"config": asdict(cfg), "counts": counts}, indent=2) + "\n")
    for name, c in counts.items():
        print(f"{name:<13} train {c['train']:>5}  validation {c['validation']:>5}", file=sys.stderr)
    return counts
