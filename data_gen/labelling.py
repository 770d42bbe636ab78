"""Hindsight labels for every review of the rollouts, cached and resumable, in parallel when asked.

`label_episodes` labels the latest reviews of each episode (`hindsight.label_point`: values by
branch re-execution, the review verdict, the restore point and segment, and for a recovery the
reflection candidates' retry success), appends each label to `labels.jsonl` as it is made, and
returns the labels in the episodes' order, so the datasets never depend on which worker finished
first. Labels made under other settings are refused rather than mixed in.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import MISSING, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from data_gen.agent_values import AgentValue, policy_factory
from data_gen.build_config import BuildConfig
from data_gen.hindsight import Label, label_point, reflection_candidates, retry_success
from data_gen.points import DecisionPoint, decision_points
from rir_runtime.envs import make_env
from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.guidance import Guidance
from rir_runtime.orchestration.executors import make_executor
from rir_runtime.recovery import PRESETS
from rir_runtime.trace import EpisodeRecord, drop_partial_tail


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
    todo = episodes_to_label(episodes, points, done, cfg)
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
    # cached points of this episode whose label recovers to a checkpoint: they took their turn at the
    # episode's `reflect_points`, so a resumed point gets reflections exactly when it did uninterrupted
    cached_recoveries: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LabelledEpisode:
    labels: tuple[dict[str, Any], ...]  # `label_to_json` rows
    skipped: tuple[str, ...]  # why a point could not be labelled


def episodes_to_label(
    episodes: list[tuple[EpisodeRecord, str]],
    points: list[list[DecisionPoint]],
    done: dict[str, dict[str, Any]],
    cfg: BuildConfig,
) -> list[EpisodeToLabel]:
    """The labelling work in the episodes' order. V_agent of a policy, error rate and rollout folder
    continues the first such episode that needs labels, whichever worker labels a later one."""
    claimed: set[str] = set(done)
    first: dict[str, tuple[EpisodeRecord, str]] = {}
    todo = []
    for (record, source), mine in zip(episodes, points, strict=True):
        ids = frozenset(p.id for p in mine if p.id not in claimed)
        if not ids:
            continue
        claimed |= ids
        run = str(Path(source).resolve())
        value_source = first.setdefault(value_key(record, run), (record, run))
        agent_values = cfg.label_value_of(source) != "expert"
        recovered = frozenset(p.id for p in mine if p.id in done and recovers(done[p.id]))
        todo.append(EpisodeToLabel(record, source, ids, value_source if agent_values else None, recovered))
    return todo


def recovers(label: dict[str, Any]) -> bool:
    """Whether a label (as cached) recovers to a checkpoint: the points that get reflections."""
    return label.get("restore") is not None and label.get("review") == "recover"


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
                reflected += point.id in item.cached_recoveries
                continue
            agent = agent_value(self.values, *item.value_source, cfg, self.out) if item.value_source else None
            try:
                label = label_point(env, point, bisect=cfg.bisect, agent=agent, ties=cfg.review_ties)
            except RIRError as err:
                skipped.append(f"skipping {point.id}: {err}")
                continue
            if recovers({"restore": label.restore, "review": label.review}) and reflected < cfg.reflect_points:
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


LABEL_SETTINGS = (
    "label_value",
    "run_label_values",
    "value_rollouts",
    "value_max_steps",
    "value_loop_repeats",
    "bisect",
    "review_ties",
)


def check_label_settings(cache: Path, cfg: BuildConfig) -> None:
    """Labels cached under other settings must not be mixed in: refuse, naming the settings and the fix."""
    meta = cache.with_name("labels.json")
    wanted = {k: getattr(cfg, k) for k in LABEL_SETTINGS}
    if cache.exists() and meta.exists():
        # a setting added later (review_ties): labels cached before it existed were made with its default
        defaults = {f.name: f.default for f in fields(cfg) if f.name in LABEL_SETTINGS and f.default is not MISSING}
        old = {**defaults, **json.loads(meta.read_text())}
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
    """The V_agent estimator of a rollout's agent (one per policy, error rate, seed and rollout folder:
    the k = 0 continuation replays the episode's own error draws), its cache in `out`; with
    agent-lesson, a recovery's continuations keep its reflection."""
    lesson = cfg.label_value_of(source) == "agent-lesson"
    key = value_key(record, source)
    if key not in values:
        run = json.loads((Path(source) / "run.json").read_text()).get("config", {})
        factory = policy_factory(record.policy, run.get("policy_mode", "rank"), record.error_rate, record.seed)
        preset = PRESETS.get(record.method)
        values[key] = AgentValue(
            factory,
            key,
            cfg.value_rollouts,
            cfg.value_max_steps,
            preset.guidance if preset else Guidance(),
            lesson=lesson,
            remember_abandoned=bool(preset and preset.remember_abandoned),
            cache_file=out / "agent_values.jsonl",
            width=cfg.branch_width,
            loop_repeats=cfg.value_loop_repeats,
        )
    return values[key]


def value_key(record: EpisodeRecord, run: str) -> str:
    """One estimator per rollout folder as well: two suites may run one policy name in different
    action modes (ScienceWorld generates, TextWorld ranks), and a continuation must act as its run did."""
    return f"{record.policy}|{record.error_rate}|{record.seed}|{Path(run).name}"
