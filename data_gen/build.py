"""`rir build-data`: rollout folders -> hindsight labels -> Hugging Face datasets in TRL formats.

    rir build-data --rollouts runs/rollout-builtin,runs/rollout-tw --out data/controller

Writes one `DatasetDict` (train / validation) per decision type under `--out`:
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
import warnings
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from data_gen.agent_values import AgentValue, policy_factory
from data_gen.hindsight import (
    DecisionPoint,
    Label,
    context_for,
    decision_points,
    label_point,
    reflection_candidates,
    retry_success,
)
from rir_runtime.controllers import failure_signal
from rir_runtime.decisions import DecisionKind, Reflection, Review, ReviewDecision, dump, parse
from rir_runtime.envs import make_env
from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.executors import EXECUTORS, check_executor, make_executor
from rir_runtime.guidance import Guidance
from rir_runtime.prompts import DecisionContext, Messages, approx_tokens, fit_decision
from rir_runtime.recovery import PRESETS
from rir_runtime.trace import TRACE_SCHEMA_VERSION, EpisodeRecord, drop_partial_tail, read_records

SFT = ("review_sft", "locate_sft", "reflect_sft")
PREF = ("review_pref", "locate_pref", "reflect_pref")
Fit = Callable[[DecisionKind, DecisionContext], Messages]  # renders a decision prompt within the token bound


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
    label_value: str = field(
        default="expert",
        metadata={
            "help": "whose chance to succeed from a checkpoint the labels compare: the environment's expert "
            "plan, or K continuations of the rollout's own agent (slower; right where the expert knows only "
            "a gold path)",
            "choices": ["expert", "agent"],
        },
    )
    value_rollouts: int = field(default=2, metadata={"help": "agent values: continuations per checkpoint (K)"})
    value_max_steps: int = field(default=30, metadata={"help": "agent values: environment steps per continuation"})
    workers: int = field(default=1, metadata={"help": "episodes labelled in parallel (processes, or Ray actors)"})
    executor: str = field(
        default="local",
        metadata={
            "help": "where labelling runs: local processes, or ray (as in rir rollout)",
            "choices": list(EXECUTORS),
        },
    )
    ray_address: str = field(default="", metadata={"help": "address of a running Ray cluster; empty: start one"})

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("rollouts is empty: pass --rollouts DIR[,DIR...]")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError("val_fraction must be within (0, 1)")
        if self.label_value not in ("expert", "agent"):
            raise ValueError(f"label_value must be expert or agent, not {self.label_value!r}")
        if self.value_rollouts < 1 or self.value_max_steps < 1:
            raise ValueError("value_rollouts and value_max_steps must be >= 1")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        check_executor(self.executor, self.ray_address)


# --- loading runs ---------------------------------------------------------------------------------------
def load_runs(folders: list[str]) -> list[tuple[EpisodeRecord, str]]:
    """(episode, its run folder) for every finished episode; older schemas and empty runs get a clear error."""
    episodes: list[tuple[EpisodeRecord, str]] = []
    for folder in folders:
        path = Path(folder)
        run = path / "run.json"
        if not run.exists():
            raise UserInputError(f"{path} is not a rollout folder (no run.json): pass folders written by `rir rollout`")
        schema = json.loads(run.read_text()).get("schema")
        if schema != TRACE_SCHEMA_VERSION:
            raise UserInputError(
                f"{path} was written with trace schema {schema}; this version reads {TRACE_SCHEMA_VERSION}: "
                f"convert it with `rir trace upgrade {path}` (or regenerate it with `rir rollout`)"
            )
        found = [e for f in sorted(path.glob("episodes-*.jsonl")) for e in read_records(f)]
        if not found:
            raise UserInputError(f"{path} holds no finished episodes: run `rir rollout` into it first")
        episodes += [(e, str(path)) for e in found]
    return episodes


# --- labelling (cached) ------------------------------------------------------------------------------------
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


def read_label_cache(path: Path) -> dict[str, dict[str, Any]]:
    """Labels already computed, by point id (a partial last line of a killed build is dropped)."""
    drop_partial_tail(path)
    if not path.exists():
        return {}
    labels = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserInputError(f"{path}:{n} is corrupt: delete {path} to relabel from scratch") from None
        labels[row["point_id"]] = row
    return labels


def label_episodes(
    episodes: list[tuple[EpisodeRecord, str]], cfg: BuildConfig, cache: Path
) -> list[tuple[DecisionPoint, dict]]:
    """Label the latest `points_per_episode` reviews of each episode; resumes from `cache`.

    Episodes are labelled on `cfg.workers` local processes or Ray actors (`cfg.executor`); each
    episode's new labels are appended to `cache` as it finishes, in any order, while the result
    follows the episodes' order, so the datasets built from it do not depend on which finished first.
    """
    from tqdm import tqdm

    check_label_settings(cache, cfg)
    done = read_label_cache(cache)
    points = [decision_points(record, source)[-cfg.points_per_episode :] for record, source in episodes]
    todo = episodes_to_label(episodes, points, done, cfg.label_value == "agent")
    runner = make_executor(cfg.executor, cfg.workers, 1, cfg.ray_address)
    with cache.open("a") as fh, tqdm(total=len(todo), desc="labelling", unit="ep", file=sys.stderr) as bar:
        for result in runner.map_unordered(partial(Labeller, cfg, cache.parent.resolve()), todo):
            for message in result.skipped:
                warnings.warn(message, stacklevel=2)
            for label in result.labels:
                done[label["point_id"]] = label
                fh.write(json.dumps(label) + "\n")
            fh.flush()
            bar.update(1)
    return [(point, done[point.id]) for mine in points for point in mine if point.id in done]


@dataclass(frozen=True)
class EpisodeToLabel:
    """An episode with decision points still to label, as shipped to a labelling worker."""

    record: EpisodeRecord
    source: str
    point_ids: frozenset[str]  # not cached, and not an earlier episode's (an id is labelled once)
    value_source: tuple[EpisodeRecord, str] | None  # agent values: the episode whose agent they continue


@dataclass(frozen=True)
class LabelledEpisode:
    labels: tuple[dict[str, Any], ...]  # `label_to_json` rows
    skipped: tuple[str, ...]  # why a point could not be labelled


def episodes_to_label(
    episodes: list[tuple[EpisodeRecord, str]],
    points: list[list[DecisionPoint]],
    done: dict[str, dict[str, Any]],
    agent_values: bool,
) -> list[EpisodeToLabel]:
    """The labelling work in the episodes' order. V_agent of a policy and error rate continues the
    first such episode that needs labels, whichever worker labels a later one."""
    claimed: set[str] = set(done)
    first: dict[str, tuple[EpisodeRecord, str]] = {}
    todo = []
    for (record, source), mine in zip(episodes, points, strict=True):
        ids = frozenset(p.id for p in mine if p.id not in claimed)
        if not ids:
            continue
        claimed |= ids
        value_source = first.setdefault(value_key(record), (record, str(Path(source).resolve())))
        todo.append(EpisodeToLabel(record, source, ids, value_source if agent_values else None))
    return todo


class Labeller:
    """A labelling worker (in this process, a worker process or a Ray actor): its environments and
    V_agent estimators live as long as it does."""

    def __init__(self, cfg: BuildConfig, out: Path) -> None:
        self.cfg, self.out = cfg, out
        self.envs: dict[str, Any] = {}
        self.values: dict[str, AgentValue] = {}

    def __call__(self, item: EpisodeToLabel) -> LabelledEpisode:
        cfg, record = self.cfg, item.record
        env = self.envs.get(record.env) or self.envs.setdefault(record.env, make_env(record.env))
        labels, skipped, reflected = [], [], 0
        for point in decision_points(record, item.source)[-cfg.points_per_episode :]:
            if point.id not in item.point_ids:
                continue
            agent = agent_value(self.values, *item.value_source, cfg, self.out) if item.value_source else None
            try:
                label = label_point(env, point, bisect=cfg.bisect, agent=agent)
            except RIRError as err:
                skipped.append(f"skipping {point.id}: {err}")
                continue
            if label.restore is not None and label.review == "recover" and reflected < cfg.reflect_points:
                reflected += 1
                label.reflections = [
                    (c, retry_success(env, label, c, cfg.reflect_retries, record.error_rate))
                    for c in reflection_candidates(label)
                ]
            labels.append(label_to_json(point.id, label))
        return LabelledEpisode(tuple(labels), tuple(skipped))

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        for value in self.values.values():
            value.close()


LABEL_SETTINGS = ("label_value", "value_rollouts", "value_max_steps", "bisect")


def check_label_settings(cache: Path, cfg: BuildConfig) -> None:
    """Labels cached under other settings must not be mixed in: refuse, naming the settings and the fix."""
    meta = cache.with_name("labels.json")
    wanted = {k: getattr(cfg, k) for k in LABEL_SETTINGS}
    if cache.exists() and meta.exists():
        old = json.loads(meta.read_text())
        changed = {k: (old.get(k), v) for k, v in wanted.items() if old.get(k) != v}
        if changed:
            said = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
            raise UserInputError(
                f"{cache} holds labels made with other settings ({said}): use a new --out, or delete it"
            )
    meta.write_text(json.dumps(wanted) + "\n")


def agent_value(
    values: dict[str, AgentValue], record: EpisodeRecord, source: str, cfg: BuildConfig, out: Path
) -> AgentValue:
    """The V_agent estimator of a rollout's agent (one per policy, error rate and seed: the k = 0
    continuation replays the episode's own error draws), its cache in `out`."""
    key = value_key(record)
    if key not in values:
        run = json.loads((Path(source) / "run.json").read_text()).get("config", {})
        factory = policy_factory(record.policy, run.get("policy_mode", "rank"), record.error_rate, record.seed)
        guidance = PRESETS[record.method].guidance if record.method in PRESETS else Guidance()
        values[key] = AgentValue(
            factory, key, cfg.value_rollouts, cfg.value_max_steps, guidance, out / "agent_values.jsonl"
        )
    return values[key]


def value_key(record: EpisodeRecord) -> str:
    return f"{record.policy}|{record.error_rate}|{record.seed}"


# --- rows --------------------------------------------------------------------------------------------------
NO_SIGNAL = "no visible failure signal"
Row = tuple[str, dict[str, Any]]  # (dataset name, row)


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _values_meta(label: dict[str, Any]) -> dict[str, Any]:
    """The hindsight values as measured (checkpoint index -> V, as JSON so Arrow keeps one column
    type) and V(now), so a row's preference can be checked without re-executing the branch."""
    values = {str(k): v for k, v in sorted(label["values"].items(), key=lambda kv: int(kv[0]))}
    return {"values": json.dumps(values), "v_now": float(label["v_now"])}


def review_reason(ctx: DecisionContext) -> str:
    """The reason both review answers give: evidence the prompt shows, never hindsight the model
    cannot see, and the same text whichever the decision, so only the decision tells them apart."""
    signal = failure_signal(ctx)
    return signal.text if signal else NO_SIGNAL


def review_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """One SFT row (the hindsight decision) and one pair (it against the other decision)."""
    ctx = context_for(point)
    prompt = fit("review", ctx)
    reason = review_reason(ctx)
    decision = label["review"]
    other: ReviewDecision = "continue" if decision == "recover" else "recover"
    good = _assistant(dump("review", Review(decision, reason)))
    bad = _assistant(dump("review", Review(other, reason)))
    meta = {**meta, "label": decision, "context": ctx.to_json(), **_values_meta(label)}
    return [
        ("review_sft", {"prompt": prompt, "completion": good, "meta": meta}),
        ("review_pref", {"prompt": prompt, "chosen": good, "rejected": bad, "meta": meta}),
    ]


def rejected_alternative(right: int, controller_pick: int | None, choices: Sequence[int]) -> int | None:
    """A wrong answer among those the prompt offers (segments or checkpoints): the controller's own
    pick when it was wrong, else the nearest other choice, later first. A later one lies past the
    harmful step (lower V, as V only falls along a branch); an earlier one has no higher V and keeps
    less progress. An answer the prompt does not offer would be a give-away, not a preference."""
    others = sorted((i for i in choices if i != right), key=lambda i: (abs(i - right), i < right))
    if controller_pick in others:
        return controller_pick
    return others[0] if others else None


def _locate_answer(kind: DecisionKind, prompt: Messages, right: int, wrong: int | None, meta: dict) -> list[Row]:
    chosen = _assistant(dump(kind, right))
    rows: list[Row] = [("locate_sft", {"prompt": prompt, "completion": chosen, "meta": meta})]
    if wrong is not None:
        pair = {"prompt": prompt, "chosen": chosen, "rejected": _assistant(dump(kind, wrong)), "meta": meta}
        rows.append(("locate_pref", pair))
    return rows


def locate_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """For a recovery: the coarse (segment) and fine (checkpoint) answers of the restore label, each
    as an SFT row and as a pair against a worse answer the same prompt offers."""
    r, seg = label["restore"], label["segment"]
    if label["review"] != "recover" or r is None:
        return []
    segs = tuple(tuple(s) for s in label["segments"])
    meta = {**meta, **_values_meta(label)}
    pick = point.chosen_step
    pick_segment = next((i for i, (a, b) in enumerate(segs) if pick is not None and a <= pick < b), None)
    ctx_c = context_for(point, "locate", segments=segs)
    meta_c = {**meta, "label": str(seg), "decision": "locate_coarse", "context": ctx_c.to_json()}
    wrong_segment = rejected_alternative(seg, pick_segment, range(len(segs)))
    rows = _locate_answer("locate_coarse", fit("locate_coarse", ctx_c), seg, wrong_segment, meta_c)
    ctx_f = context_for(point, "locate", segments=segs, segment=segs[seg])
    meta_f = {**meta, "label": str(r), "decision": "locate_fine", "context": ctx_f.to_json()}
    a, b = segs[seg]
    wrong_step = rejected_alternative(r, pick, [i for i in ctx_f.admissible if a <= i < b])
    return rows + _locate_answer("locate_fine", fit("locate_fine", ctx_f), r, wrong_step, meta_f)


def reflect_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """The reflection with the best retry success as the SFT target, and a pair of it against each
    non-empty candidate that did strictly worse (ties teach nothing; a pair against the empty
    reflection would teach "write something" rather than what to write, so it is measured, not paired)."""
    if not label["reflections"]:
        return []
    candidates = [(parse("reflect", json.dumps(c)) if c else Reflection(), rate) for c, rate in label["reflections"]]
    ranked = sorted(candidates, key=lambda x: -x[1])  # stable: hindsight before "none" on ties
    best, top = ranked[0]
    chosen = _assistant(dump("reflect", best))
    ctx_r = context_for(point, "reflect", restore_point=label["restore"])
    prompt = fit("reflect", ctx_r)
    rates = json.dumps([[c.to_json(), rate] for c, rate in candidates])
    meta = {**meta, "decision": "reflect", "context": ctx_r.to_json(), "retry_success": rates}
    rows: list[Row] = [
        ("reflect_sft", {"prompt": prompt, "completion": chosen, "meta": {**meta, "label": f"{top:.2f}"}})
    ]
    for worse, rate in ranked[1:]:
        if rate < top and worse != Reflection():
            pair = {"prompt": prompt, "chosen": chosen, "rejected": _assistant(dump("reflect", worse))}
            rows.append(("reflect_pref", {**pair, "meta": {**meta, "label": f"{top:.2f}>{rate:.2f}"}}))
    return rows


def rows_for(point: DecisionPoint, label: dict[str, Any], fit: Fit) -> dict[str, list[dict[str, Any]]]:
    """All SFT and preference rows one labelled decision point yields."""
    ep = point.record
    meta = {
        "env": ep.env,
        "task": ep.task,
        "split": ep.split,
        "variation": ep.variation,
        "episode_id": ep.episode_id,
        "step": len(point.history),
        "source_run": point.source_run,
        "decision": "review",
    }
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for make in (review_rows, locate_rows, reflect_rows):
        for name, row in make(point, label, fit, meta):
            rows[name].append(row)
    return rows


def token_counter(tokenizer_name: str) -> Any:
    if not tokenizer_name:
        return approx_tokens
    from rir_runtime.llm.registry import load_tokenizer

    tok = load_tokenizer(tokenizer_name)

    def count(messages: Messages) -> int:
        encoded = tok.apply_chat_template(messages, tokenize=True)
        # transformers >= 5 returns a BatchEncoding, whose len() is its number of fields
        return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    return count


# --- splitting -----------------------------------------------------------------------------------------------
def variation_key(meta: dict[str, Any]) -> str:
    return f"{meta['env']}/{meta['task']}/{meta['split']}/{meta['variation']}"


def _rank(key: str) -> int:
    return zlib.crc32(key.encode())


def validation_variations(keys: set[str], fraction: float) -> set[str]:
    """A deterministic share of task variations held out: never on both sides of the split."""
    ranked = sorted(keys, key=_rank)
    n_val = max(1, round(fraction * len(ranked))) if len(ranked) > 1 else 0
    return set(ranked[:n_val])


def _both_sides(keys: set[str], held: set[str]) -> bool:
    return bool(keys & held) and bool(keys - held)


def _harmless(after: set[str], held: set[str], splittable: list[set[str]]) -> bool:
    """Moving from `held` to `after` leaves every dataset that had both sides with both sides."""
    return all(_both_sides(k, after) for k in splittable if _both_sides(k, held))


def held_out_variations(by_dataset: dict[str, set[str]], fraction: float) -> set[str]:
    """One held-out set of task variations for all datasets (the adapter trains on them mixed, so a
    variation in one dataset's train and another's validation would leak). It starts from the
    deterministic share; then each dataset with >= 2 variations but an empty side gets its
    first-ranked variation moved across, and a dataset from a single variation goes to train
    (trainable, if not evaluable), each move only where no other dataset loses a side."""
    held = validation_variations(set().union(*by_dataset.values()), fraction)
    splittable = [keys for keys in by_dataset.values() if len(keys) >= 2]
    moved_one = True
    while moved_one:  # each move gives one more dataset both sides and takes none away: it ends
        moved_one = False
        for keys in (k for k in splittable if not _both_sides(k, held)):
            into_held = not keys & held
            for key in sorted(keys - held if into_held else keys & held, key=_rank):
                after = held | {key} if into_held else held - {key}
                if _harmless(after, held, splittable):
                    held, moved_one = after, True
                    break
    for keys in by_dataset.values():
        if len(keys) == 1 and keys <= held and _harmless(held - keys, held, splittable):
            held = held - keys
    return held


def split_rows(rows: list[dict[str, Any]], held_out: set[str]) -> dict[str, list[dict[str, Any]]]:
    return {
        "train": [r for r in rows if variation_key(r["meta"]) not in held_out],
        "validation": [r for r in rows if variation_key(r["meta"]) in held_out],
    }


def warn_about(name: str, splits: dict[str, list[dict[str, Any]]]) -> None:
    """Name a dataset that training cannot use as it is: a missing split, or one review label."""
    variations = {variation_key(r["meta"]) for rows in splits.values() for r in rows}
    for split, rows in splits.items():
        if not rows:
            why = (
                "its rows come from one task variation, which cannot be on both sides"
                if len(variations) < 2
                else "no held-out set gives every dataset both sides without sharing a variation"
            )
            print(f"warning: {name} has no {split} split: {why} (roll out more task variations)", file=sys.stderr)
    labels = Counter(r["meta"]["label"] for rows in splits.values() for r in rows)
    if name.startswith("review") and len(labels) < 2:
        print(
            f"warning: {name} has only the label {next(iter(labels))!r}; a controller cannot learn "
            "both decisions from it (add exploratory rollouts or more tasks)",
            file=sys.stderr,
        )


# --- writing -------------------------------------------------------------------------------------------------
def dataset_card(
    name: str, splits: dict[str, list[dict]], sources: list[str], cfg: BuildConfig, sides: tuple[int, int]
) -> str:
    """The README of one dataset; `sides` counts the build's train and held-out task variations. Its
    front matter (splits and files, task, license, tags) lets the folder be pushed to the Hub as is."""
    from data_gen.cards import dataset_metadata, front_matter

    fmt = ("sft", "prompt-completion") if name.endswith("_sft") else ("preference", "dpo")
    envs = sorted({str(r["meta"]["env"]) for rows in splits.values() for r in rows if r["meta"].get("env")})
    tags = [*fmt, "controller", name.split("_")[0], *envs]
    metadata = dataset_metadata({s: len(r) for s, r in splits.items()}, pretty_name=f"RIR {name}", tags=tags)
    lines = [
        front_matter(metadata),
        f"# {name}",
        "",
        f"Recovery-controller decisions labelled in hindsight by branch re-execution "
        f"(RIR `rir build-data`). Format: TRL conversational "
        f"{'prompt-completion' if name.endswith('_sft') else 'preference'}.",
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
        "",
        "Source runs:",
    ]
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

    def fit(kind: DecisionKind, ctx: DecisionContext) -> Messages:
        return fit_decision(kind, ctx, cfg.max_prompt_tokens, count)

    all_rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for point, label in labelled:
        for name, rows in rows_for(point, label, fit).items():
            all_rows[name] += rows
    by_dataset = {name: {variation_key(r["meta"]) for r in all_rows.get(name, [])} for name in SFT + PREF}
    held_out = held_out_variations(by_dataset, cfg.val_fraction)
    every = set().union(*by_dataset.values())
    sides = (len(every - held_out), len(every & held_out))
    counts: dict[str, dict[str, int]] = {}
    for name in SFT + PREF:
        rows = all_rows.get(name, [])
        if not rows:
            print(f"skipped {name}: no examples (no labelled decision of this kind in the runs)", file=sys.stderr)
            continue
        splits = split_rows(rows, held_out)
        warn_about(name, splits)
        DatasetDict({s: Dataset.from_list(r) for s, r in splits.items() if r}).save_to_disk(str(out / name))
        (out / name / "README.md").write_text(dataset_card(name, splits, cfg.rollouts, cfg, sides))
        counts[name] = {s: len(r) for s, r in splits.items()}
    summary = {"config": asdict(cfg), "counts": counts, "validation_variations": sorted(held_out)}
    (out / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, c in counts.items():
        print(f"{name:<13} train {c['train']:>5}  validation {c['validation']:>5}", file=sys.stderr)
    return counts
