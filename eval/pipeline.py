"""`rir pipeline`: every stage end to end, cached, with one report that names the winner.

    rir pipeline --config configs/pipeline/quickstart.yaml

Stages: rollouts on train variations -> hindsight labels and datasets -> LoRA SFT of the
controller (then DPO when configured) -> offline decision quality on the validation split ->
evaluation on test variations (methods x controllers) -> `report.md`.

Each stage records a key (a hash of its settings and of its inputs' keys) in `<stage>/stage.json`.
A re-run skips a stage whose key matches; a changed setting re-runs that stage and everything
downstream of it (its old outputs are removed first, so nothing stale is mixed in).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rir_runtime.errors import RIRError, UserInputError


@dataclass
class Suite:
    """One benchmark of the pipeline: train variations feed the data, test variations the eval."""

    env: str = "builtin"
    tasks: list[str] = field(default_factory=list)
    train_variations: str = "0-19"
    test_variations: str = "0-9"


@dataclass
class PipelineConfig:
    out: str = field(default="runs/quickstart", metadata={"help": "pipeline folder"})
    suites: list[Suite] = field(default_factory=lambda: [Suite()], metadata={"help": "benchmarks (YAML list)"})
    base_model: str = field(default="smollm2-135m-instruct", metadata={"help": "controller base model"})
    policy: str = field(default="noisy-expert", metadata={"help": "base policy of rollouts and eval"})
    error_rate: float = field(default=0.15, metadata={"help": "noisy-expert error rate"})
    explore: list[str] = field(
        default_factory=lambda: ["random-review", "random-restore"],
        metadata={"help": "exploratory rollout controllers"},
    )
    sft_config: str = field(default="configs/train/sft_cpu_quick.yaml", metadata={"help": "SFT YAML"})
    sft_max_steps: int = field(default=0, metadata={"help": "override the SFT config's max_steps (0: keep)"})
    sft_max_length: int = field(default=0, metadata={"help": "override the training max_length (0: keep)"})
    dpo_config: str = field(default="", metadata={"help": "DPO YAML after SFT (empty: no DPO)"})
    dpo_max_steps: int = field(default=0, metadata={"help": "override the DPO config's max_steps (0: keep)"})
    max_prompt_tokens: int = field(default=1024, metadata={"help": "prompt bound of the datasets"})
    eval_methods: list[str] = field(default_factory=lambda: ["react", "rir"], metadata={"help": "methods on test"})
    eval_controllers: list[str] = field(
        default_factory=lambda: ["heuristic", "prompted", "tuned"],
        metadata={"help": "heuristic, oracle, prompted (the base model), tuned (the trained adapter), or full specs"},
    )
    budget_agent: int = field(default=40, metadata={"help": "B_agent in the eval"})
    budget_rollback: int = field(default=3, metadata={"help": "B_rb in the eval"})
    review_interval: int = field(default=4, metadata={"help": "initial scheduled review interval"})
    controller_eval_rows: int = field(default=40, metadata={"help": "validation rows per dataset scored offline"})
    workers: int = field(default=1, metadata={"help": "worker processes for rollouts and eval"})

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError("suites is empty: list at least one benchmark")


# --- the stage cache ------------------------------------------------------------------------------------
def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """Runs stages in order; skips those whose key is already recorded as done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.timings: dict[str, float] = {}

    def run(self, name: str, key: str, fn: Callable[[Path], None]) -> Path:
        folder = self.root / name
        marker = folder / "stage.json"
        if marker.exists() and json.loads(marker.read_text()).get("key") == key:
            print(f"[pipeline] {name}: cached", file=sys.stderr)
            self.timings[name] = json.loads(marker.read_text()).get("wall_s", 0.0)
            return folder
        if folder.exists():
            shutil.rmtree(folder)  # settings changed: never mix old outputs in
        folder.mkdir(parents=True)
        print(f"[pipeline] {name}: running", file=sys.stderr)
        start = time.perf_counter()
        fn(folder)
        wall = time.perf_counter() - start
        self.timings[name] = wall
        marker.write_text(json.dumps({"key": key, "wall_s": round(wall, 1)}) + "\n")
        return folder


def _train(kind: str, config: str, out: Path, model: str, data: Path, max_steps: int, extra: list[str]) -> None:
    if not Path(config).exists():
        raise UserInputError(f"{kind} config {config} does not exist: fix `{kind}_config` in the pipeline YAML")
    cmd = (
        [
            sys.executable,
            "-m",
            f"train.{kind}",
            "--config",
            config,
            "--model",
            model,
            "--data",
            str(data),
            "--output_dir",
            str(out),
        ]
        + (["--max_steps", str(max_steps)] if max_steps else [])
        + extra
    )
    print("[pipeline] $ " + " ".join(cmd), file=sys.stderr)
    if subprocess.run(cmd).returncode != 0:
        raise RIRError(f"{kind} training failed (see the log above); the pipeline stops here, rerun to resume")


def controller_spec(name: str, cfg: PipelineConfig, adapter: Path) -> str:
    return {"prompted": f"prompted:{cfg.base_model}", "tuned": f"tuned:{adapter}"}.get(name, name)


# --- the pipeline -------------------------------------------------------------------------------------------
def run_pipeline(cfg: PipelineConfig) -> Path:
    from data_gen.build import BuildConfig, build
    from data_gen.rollout import RolloutConfig, rollout
    from eval.controller_eval import ControllerEvalConfig, evaluate_controllers
    from eval.harness import EvalConfig, evaluate

    start = time.perf_counter()
    root = Path(cfg.out)
    stages = Stages(root)
    common = {"policy": cfg.policy, "error_rate": cfg.error_rate}

    rollout_dirs, keys = [], []
    for suite in cfg.suites:
        rc = dict(
            env=suite.env,
            tasks=suite.tasks,
            split="train",
            variations=suite.train_variations,
            methods=["rir"],
            controller=["heuristic"],
            explore=cfg.explore,
            workers=cfg.workers,
            review_interval=cfg.review_interval,
            **common,
        )
        key = _key("rollout", rc)
        rollout_dirs.append(
            stages.run(f"rollout-{suite.env}", key, lambda d, rc=rc: rollout(RolloutConfig(**rc, out=str(d))))
        )
        keys.append(key)

    data_key = _key("data", keys, cfg.max_prompt_tokens, cfg.base_model)
    data = stages.run(
        "data",
        data_key,
        lambda d: build(
            BuildConfig(
                rollouts=[str(p) for p in rollout_dirs],
                out=str(d),
                max_prompt_tokens=cfg.max_prompt_tokens,
                tokenizer=cfg.base_model,
            )
        ),
    )

    sft_key = _key(
        "sft",
        data_key,
        cfg.base_model,
        Path(cfg.sft_config).read_text() if Path(cfg.sft_config).exists() else cfg.sft_config,
        cfg.sft_max_steps,
        cfg.sft_max_length,
    )
    length = ["--max_length", str(cfg.sft_max_length)] if cfg.sft_max_length else []
    adapter = stages.run(
        "sft", sft_key, lambda d: _train("sft", cfg.sft_config, d, cfg.base_model, data, cfg.sft_max_steps, length)
    )
    tuned_key = sft_key
    if cfg.dpo_config:
        tuned_key = _key(
            "dpo",
            sft_key,
            Path(cfg.dpo_config).read_text() if Path(cfg.dpo_config).exists() else cfg.dpo_config,
            cfg.dpo_max_steps,
        )
        adapter = stages.run(
            "dpo",
            tuned_key,
            lambda d: _train(
                "dpo",
                cfg.dpo_config,
                d,
                cfg.base_model,
                data,
                cfg.dpo_max_steps,
                ["--sft_adapter", str(adapter)] + length,
            ),
        )

    specs = [controller_spec(c, cfg, adapter) for c in cfg.eval_controllers]
    offline_specs = [s for s in specs if s != "oracle"]
    ce_key = _key("controller-eval", tuned_key, offline_specs, cfg.controller_eval_rows)
    ce_dir = stages.run(
        "controller-eval",
        ce_key,
        lambda d: evaluate_controllers(
            ControllerEvalConfig(
                data=str(data), controller=offline_specs, max_rows=cfg.controller_eval_rows, out=str(d)
            )
        ),
    )

    eval_dirs = []
    for suite in cfg.suites:
        ec = dict(
            env=suite.env,
            tasks=suite.tasks,
            split="test",
            variations=suite.test_variations,
            methods=cfg.eval_methods,
            controller=specs,
            budget_agent=cfg.budget_agent,
            budget_rollback=cfg.budget_rollback,
            review_interval=cfg.review_interval,
            workers=cfg.workers,
            **common,
        )
        eval_dirs.append(
            stages.run(
                f"eval-{suite.env}",
                _key("eval", tuned_key, ec),
                lambda d, ec=ec: evaluate(EvalConfig(**ec, out=str(d))),
            )
        )

    report = root / "report.md"
    report.write_text(final_report(cfg, specs, ce_dir, eval_dirs, stages.timings, time.perf_counter() - start))
    (root / "pipeline.json").write_text(json.dumps(asdict(cfg), indent=2, default=str) + "\n")
    print(f"[pipeline] done in {time.perf_counter() - start:.0f}s; report: {report}", file=sys.stderr)
    return report


# --- the final report -----------------------------------------------------------------------------------------
def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def headline(specs: list[str], evals: list[dict[str, Any]]) -> list[str]:
    """Which controller won the RIR comparison on the test split, by how much, at what cost."""
    pooled: dict[str, list[float]] = {}
    for summary in evals:
        for name, s in summary.get("methods", {}).items():
            method, _, controller = name.partition("/")
            if method == "rir" and controller:
                acc = pooled.setdefault(controller, [0, 0, 0.0])
                acc[0] += s["success_rate"] * s["episodes"]
                acc[1] += s["episodes"]
                acc[2] += s["agent_calls"] * s["episodes"]
    if not pooled:
        return ["No RIR episodes were evaluated, so no controller comparison is available."]
    ranked = sorted(pooled.items(), key=lambda kv: (-kv[1][0] / kv[1][1], kv[1][2] / kv[1][1]))
    (best, b), rest = ranked[0], ranked[1:]
    line = (
        f"**Winner: `{best}`** with {b[0] / b[1]:.1%} test success over {int(b[1])} RIR episodes, "
        f"at {b[2] / b[1]:.1f} agent calls per episode"
    )
    if rest:
        second, s = rest[0]
        line += (
            f"; runner-up `{second}` {s[0] / s[1]:.1%} ({(b[0] / b[1] - s[0] / s[1]) * 100:+.1f} points, "
            f"{s[2] / s[1]:.1f} calls)."
        )
    others = [f"`{c}` {v[0] / v[1]:.1%} at {v[2] / v[1]:.1f} calls" for c, v in rest[1:]]
    return [line] + ([f"Others: {', '.join(others)}."] if others else [])


def benchmark_table(envs: list[str], evals: list[dict[str, Any]]) -> str:
    """Methods as rows, benchmarks as columns: success rate (agent calls per episode)."""
    methods = sorted({m for s in evals for m in s.get("methods", {})})
    rows = ["| method | " + " | ".join(envs) + " |", "| --- |" + " ---: |" * len(envs)]
    for m in methods:
        cells = []
        for s in evals:
            x = s.get("methods", {}).get(m)
            cells.append(f"{x['success_rate']:.1%} ({x['agent_calls']:.1f})" if x else "-")
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def final_report(
    cfg: PipelineConfig, specs: list[str], ce_dir: Path, eval_dirs: list[Path], timings: dict[str, float], wall_s: float
) -> str:
    from eval.report import table

    evals = [_load(d / "summary.json") for d in eval_dirs]
    lines = (
        ["# RIR pipeline report", ""]
        + headline(specs, evals)
        + [
            "",
            f"Base model `{cfg.base_model}`, policy `{cfg.policy}` (error rate {cfg.error_rate}), "
            f"budgets B_agent={cfg.budget_agent}, B_rb={cfg.budget_rollback}; pipeline wall time {wall_s:.0f}s.",
            "",
        ]
    )
    if len(evals) > 1:
        lines += ["## Main table (test split)", "", benchmark_table([s.env for s in cfg.suites], evals), ""]
    for suite, d, summary in zip(cfg.suites, eval_dirs, evals, strict=True):
        lines += [
            f"## Test split: {suite.env} (variations {suite.test_variations})",
            "",
            table(summary),
            "",
            f"Details: `{d / 'report.md'}`",
            "",
        ]
    ce = ce_dir / "controller_eval.md"
    if ce.exists():
        lines += ["## Offline decision quality (validation split)", "", ce.read_text().split("\n", 2)[-1], ""]
    lines += ["## Stage wall times", "", "| stage | seconds |", "| --- | ---: |"]
    lines += [f"| {name} | {sec:.0f} |" for name, sec in timings.items()]
    return "\n".join(lines) + "\n"
