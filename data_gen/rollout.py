"""`rir rollout`: RIR episodes at scale with a base policy, into an append-only run folder.

    rir rollout --env builtin --split train --variations 0-99 --workers 2 --out runs/rollout-builtin
    rir rollout --config configs/rollout/builtin.yaml --shard 1/4     # one of four machines

The folder holds `episodes-<shard>.jsonl` (one episode per line, with every event) and `run.json`
(config, versions, seed, schema). Re-running resumes: finished episodes are skipped. Besides the
controller under study, exploratory variants (random review verdicts, random restore points) add
decisions the controller would not make, so hindsight labels cover both kinds of mistakes.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.jobs import EpisodeJob, SelectionConfig, check_nonempty, expand_jobs, run_jobs
from rir_runtime.trace import TRACE_SCHEMA_VERSION, EpisodeRecord


@dataclass
class RolloutConfig(SelectionConfig):
    """Selection flags plus sharding and exploration; defaults suit data generation."""

    split: str = field(
        default="train", metadata={"help": "variation split (data uses train)", "choices": ["train", "dev", "test"]}
    )
    methods: list[str] = field(default_factory=lambda: ["rir"], metadata={"help": "comma list of presets"})
    explore: list[str] = field(
        default_factory=lambda: ["random-review", "random-restore"],
        metadata={"help": "extra exploratory controllers run on the same tasks"},
    )
    shard: str = field(default="0/1", metadata={"help": "i/N: run the i-th of N interleaved parts of the job"})
    out: str = field(default="runs/rollout", metadata={"help": "run folder"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.shard_index, self.shard_count = parse_shard(self.shard)


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"shard '{text}' must look like i/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard '{text}' does not exist: with N={n} shards, i must be within 0..{n - 1}")
    return i, n


def rollout_jobs(cfg: RolloutConfig) -> list[EpisodeJob]:
    """The whole job (all shards) in a fixed order; the controller first, then the variants."""
    jobs = expand_jobs(cfg)
    for variant in cfg.explore:
        jobs += [replace(j, tag=variant) for j in expand_jobs(replace(cfg, controller=[variant]))]
    return jobs


def shard_jobs(jobs: list[EpisodeJob], index: int, count: int) -> list[EpisodeJob]:
    if count > len(jobs):
        raise UserInputError(
            f"{count} shards for {len(jobs)} episodes leaves some shards empty: use at most "
            f"{len(jobs)} shards or select more episodes"
        )
    return jobs[index::count]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("rir", "torch", "transformers", "trl", "peft", "datasets", "scienceworld", "textworld"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_run_json(out: Path, cfg: RolloutConfig) -> None:
    """Record the run's config; refuse to mix a different selection into an existing folder."""
    path = out / "run.json"
    how = ("shard", "workers", "concurrency", "executor", "ray_address", "out")  # how it runs, not what
    config = {k: v for k, v in asdict(cfg).items() if k not in how}
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("schema") != TRACE_SCHEMA_VERSION:
            raise UserInputError(
                f"{path} has trace schema {old.get('schema')}, this version writes {TRACE_SCHEMA_VERSION}: "
                f"convert it with `rir trace upgrade {out}`, or use a new --out folder"
            )
        if old.get("config") != config:
            changed = sorted(k for k in config if old.get("config", {}).get(k) != config[k])
            raise UserInputError(
                f"{out} holds a run with a different config ({', '.join(changed)}): use a new "
                "--out folder, or the same settings to resume"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    payload = {"schema": TRACE_SCHEMA_VERSION, "config": config, "versions": versions(), "seed": cfg.seeds}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def rollout(cfg: RolloutConfig) -> list[EpisodeRecord]:
    out = Path(cfg.out)
    jobs = rollout_jobs(cfg)
    check_nonempty(jobs)
    mine = shard_jobs(jobs, cfg.shard_index, cfg.shard_count)
    write_run_json(out, cfg)
    path = out / f"episodes-{cfg.shard_index}.jsonl"
    records = run_jobs(
        mine, path, cfg.workers, cfg.concurrency, desc="rollout", executor=cfg.executor, ray_address=cfg.ray_address
    )
    wins = sum(r.success for r in records)
    print(f"{len(records)} episodes in {out} (shard {cfg.shard}); success {wins}/{len(records)}", file=sys.stderr)
    return records
