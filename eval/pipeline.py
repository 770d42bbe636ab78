"""`rir pipeline`: every stage end to end, cached, with one report that names the winner.

    rir pipeline --config configs/pipeline/quickstart.yaml

Stages: rollouts on train variations -> hindsight labels and datasets -> LoRA SFT of the
controller (then DPO when configured) -> offline decision quality on the validation split ->
evaluation on test variations (methods x controllers) -> `report.md`.

Stages are cached and resumable (`rir_runtime/orchestration/stages.py`): killing `rir pipeline` and running it
again loses no work, and a stage whose settings or inputs changed is redone, with everything
downstream of it, after a line that says what changed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from data_gen.build_config import LABEL_VALUES, BuildConfig
from data_gen.hindsight import REVIEW_TIES
from eval.controller_eval import CONTROLLER_EVAL
from eval.paired import PairedComparison, combine, find_comparison
from eval.summary import ROOM_BASE, ROOM_BOUND, SUMMARY
from rir_runtime.controllers import ControllerSpec
from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.launch import LAUNCHERS, last_complete_checkpoint, run_training, train_command
from rir_runtime.orchestration.output_lock import exclusive_output
from rir_runtime.orchestration.stages import Stages, yaml_settings
from rir_runtime.policy_spec import NOISY_EXPERT, PolicySpec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass
class Suite:
    """One benchmark of the pipeline: train variations feed the data, test variations the eval. A suite
    may bring its own agent (e.g. the cloned LLM agent, whose own mistakes the controller must learn)
    and budget; empty fields take the pipeline's."""

    env: str = "builtin"
    tasks: list[str] = field(default_factory=list)
    train_variations: str = "0-19"  # empty: this suite only evaluates
    test_variations: str = "0-9"  # empty: this suite only feeds the data
    name: str = ""  # stage folders are rollout-<name> / eval-<name>; default: the environment
    policy: str = ""
    policy_mode: str = ""
    budget_agent: str = ""
    budget_rollback: int | None = None  # rollouts and evaluation; unset: the rollout default, and the pipeline's
    label_value: str = ""  # e.g. agent-lesson for the suite of the agent's own rollouts
    error_rate: float | None = None  # the noisy expert's, where it differs from the pipeline's

    @property
    def label(self) -> str:
        return self.name or self.env


@dataclass
class PipelineConfig:
    out: str = field(default="runs/quickstart", metadata={"help": "pipeline folder"})
    suites: list[Suite] = field(default_factory=lambda: [Suite()], metadata={"help": "benchmarks (YAML list)"})
    base_model: str = field(default="smollm2-135m-instruct", metadata={"help": "controller base model"})
    policy: str = field(default=NOISY_EXPERT, metadata={"help": "base policy of rollouts and eval"})
    error_rate: float = field(default=0.15, metadata={"help": "noisy-expert error rate"})
    policy_mode: str = field(
        default="rank", metadata={"help": "LLM action mode", "choices": ["rank", "generate", "constrain"]}
    )
    label_value: str = field(
        default="expert",
        metadata={
            "help": "hindsight values of the labels: the expert's or the agent's own (agent-lesson: a "
            "recovery's reflection kept in memory); a suite may set its own",
            "choices": list(LABEL_VALUES),
        },
    )
    value_rollouts: int = field(
        default=BuildConfig.value_rollouts, metadata={"help": "agent values: continuations per checkpoint (K)"}
    )
    bisect: bool = field(
        default=True,
        metadata={"help": "find restore labels by bisection (V_expert); agent values for the value controller: false"},
    )
    val_fraction: float = field(default=0.2, metadata={"help": "share of task variations held out for validation"})
    value_pairs_per_point: int = field(default=8, metadata={"help": "value controller pairs per decision point"})
    value_max_steps: int = field(
        default=BuildConfig.value_max_steps, metadata={"help": "agent values: environment steps per continuation"}
    )
    review_ties: str = field(
        default="continue",
        metadata={
            "help": "the review label where the values cannot tell recovering from continuing: continue, "
            "or heuristic (the rule controller's decision)",
            "choices": list(REVIEW_TIES),
        },
    )
    explore: list[str] = field(
        default_factory=lambda: ["random-review", "random-restore"],
        metadata={"help": "exploratory rollout controllers"},
    )
    sft_config: str = field(default="configs/train/sft_cpu_quick.yaml", metadata={"help": "SFT YAML"})
    sft_max_steps: int = field(default=0, metadata={"help": "override the SFT config's max_steps (0: keep)"})
    sft_max_length: int = field(default=0, metadata={"help": "override the training max_length (0: keep)"})
    dpo_config: str = field(default="", metadata={"help": "DPO YAML after SFT (empty: no DPO)"})
    dpo_max_steps: int = field(default=0, metadata={"help": "override the DPO config's max_steps (0: keep)"})
    value_config: str = field(
        default="", metadata={"help": "value controller YAML (rir train value; empty: no value controller)"}
    )
    value_max_train_steps: int = field(default=0, metadata={"help": "override the value config's max_steps (0: keep)"})
    train_seed: int = field(
        default=0, metadata={"help": "override the SFT and DPO configs' seed (0: keep), to measure run-to-run spread"}
    )
    launcher: str = field(default="python", metadata={"help": "how training runs", "choices": list(LAUNCHERS)})
    accelerate_config: str = field(default="", metadata={"help": "accelerate config file (launcher accelerate)"})
    max_prompt_tokens: int = field(default=1024, metadata={"help": "prompt bound of the datasets"})
    eval_methods: list[str] = field(default_factory=lambda: ["react", "rir"], metadata={"help": "methods on test"})
    eval_controllers: list[str] = field(
        default_factory=lambda: ["heuristic", "prompted", "tuned"],
        metadata={
            "help": "heuristic, oracle, prompted (the base model), tuned (the trained adapter), value (the value "
            "controller), or full specs where {prompted}, {tuned} and {value} stand for those; a spec with a "
            "{model} slot is evaluated twice, with the adapter and with its prompted base"
        },
    )
    budget_agent: str = field(default="40", metadata={"help": "B_agent in the eval: 40, or 1.5x the expert's path"})
    budget_rollback: int = field(default=3, metadata={"help": "B_rb in the eval"})
    budget_controller: int | None = field(
        default=None, metadata={"help": "B_ctrl in the eval: the controller's model calls, apart from B_agent"}
    )
    charge_controller: bool = field(
        default=False, metadata={"help": "charge the controller's model calls to B_agent in the eval"}
    )
    review_interval: int = field(default=4, metadata={"help": "initial scheduled review interval"})
    controller_eval_rows: int = field(default=40, metadata={"help": "validation rows per dataset scored offline"})
    controller_eval_reflect_rows: int = field(
        default=-1, metadata={"help": "reflection rows scored offline (slow: generated); -1: controller_eval_rows"}
    )
    workers: int = field(default=1, metadata={"help": "worker processes for rollouts and eval"})

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError("suites is empty: list at least one benchmark")
        labels = [suite.label for suite in self.suites]
        if len(set(labels)) < len(labels):
            raise ValueError(f"suite names {labels} repeat: give suites on one environment distinct `name`s")
        if bad := [suite.label for suite in self.suites if suite.label_value not in ("", *LABEL_VALUES)]:
            raise ValueError(f"suites {bad} set a label_value that is not one of {', '.join(LABEL_VALUES)}")
        if not any(suite.train_variations for suite in self.suites):
            raise ValueError("no suite has train_variations: the controller would have no data")


# --- the stage cache ------------------------------------------------------------------------------------
def _train(
    cfg: PipelineConfig, kind: str, config: str, out: Path, data: Path, max_steps: int, extra: list[str]
) -> None:
    args = ["--config", config, "--model", cfg.base_model, "--data", str(data), "--output_dir", str(out)]
    args += (["--max_steps", str(max_steps)] if max_steps else []) + extra
    args += ["--seed", str(cfg.train_seed)] if cfg.train_seed else []
    start = last_complete_checkpoint(out)
    if start is not None:
        print(f"[pipeline] {kind}: resuming training from {start}", file=sys.stderr)
        args += ["--resume_from_checkpoint", str(start)]
    run_training(f"{kind} training", train_command(f"train.{kind}", args, cfg.launcher, cfg.accelerate_config))


# The fields of each stage's config that its cache key covers: those the pipeline sets (the other fields
# keep their defaults, and keying on them would redo cached stages when a default is added).
ROLLOUT_KEY = (
    "env", "tasks", "split", "variations", "methods", "controller", "explore", "workers", "review_interval",
    "policy", "policy_mode", "error_rate", "budget_agent", "budget_rollback",
)  # fmt: skip
DATA_KEY = (
    "max_prompt_tokens", "tokenizer", "label_value", "run_label_values", "value_rollouts", "value_max_steps",
    "review_ties", "bisect", "val_fraction", "value_pairs_per_point",
)  # fmt: skip
CONTROLLER_EVAL_KEY = ("controller", "max_rows", "max_reflect_rows")
EVAL_KEY = (
    "env", "tasks", "split", "variations", "methods", "controller", "budget_agent", "budget_rollback",
    "budget_controller", "charge_controller", "review_interval", "workers", "policy", "policy_mode", "error_rate",
)  # fmt: skip


def _key_settings(config: DataclassInstance, names: tuple[str, ...]) -> dict[str, Any]:
    """The `names` fields of a stage's config, for its cache key."""
    values = asdict(config)
    return {name: values[name] for name in names}


MODEL_SLOT = "{model}"  # in a served form: filled once with the tuned adapter, once with its prompted base


def controller_specs(name: str, cfg: PipelineConfig, adapter: Path, value: Path | None = None) -> list[str]:
    """The controllers an `eval_controllers` entry names. `prompted` and `tuned` are the base model and
    the trained adapter, `value` the value controller (`value_config`); in a served form, `{prompted}`,
    `{tuned}` and `{value}` stand for them (`when=heuristic;where={value};what=heuristic`: the rule's When
    with the value controller's Where). A served form with a `{model}` slot
    (`when=residual:{model};where={model};what=heuristic`) is evaluated with both the tuned and the
    prompted model, so the tuned form meets its fair control: the same form with the untrained model,
    not the whole prompted controller."""
    if (name == "value" or "{value}" in name) and value is None:
        raise UserInputError(f"eval_controllers names {name!r}, but no value_config trains a value controller")
    models = {"prompted": f"prompted:{cfg.base_model}", "tuned": f"tuned:{adapter}", "value": f"value:{value}"}
    for kind, spec in models.items():
        name = name.replace("{" + kind + "}", spec)
    if MODEL_SLOT in name:
        return [name.replace(MODEL_SLOT, models[kind]) for kind in ("tuned", "prompted")]
    return [models.get(name, name)]


# --- the stages, in the order they run ----------------------------------------------------------------------
def run_pipeline(cfg: PipelineConfig) -> Path:
    """Every stage in order, each cached; the output folder is this process's while it runs (a second
    pipeline into it is refused)."""
    with exclusive_output(cfg.out):
        return run_stages(cfg)


def run_stages(cfg: PipelineConfig) -> Path:
    start = time.perf_counter()
    root = Path(cfg.out)
    stages = Stages(root)
    rollouts = {suite.label: rollout_stage(stages, cfg, suite) for suite in cfg.suites if suite.train_variations}
    data = data_stage(stages, cfg, list(rollouts.values()))
    adapters = [sft_stage(stages, cfg, data)]
    if cfg.dpo_config:
        adapters.append(dpo_stage(stages, cfg, data, adapters[0]))
    adapter = adapters[-1]
    value = value_stage(stages, cfg, data) if cfg.value_config else None
    specs = [spec for c in cfg.eval_controllers for spec in controller_specs(c, cfg, adapter, value)]
    trained = adapters + ([value] if value else [])
    ce_dir = controller_eval_stage(stages, cfg, data, adapters, specs, row_groups(cfg, rollouts), trained)
    eval_dirs = [eval_stage(stages, cfg, suite, trained, specs) for suite in cfg.suites if suite.test_variations]

    report = root / "report.md"
    report.write_text(final_report(cfg, ce_dir, eval_dirs, stages.timings, time.perf_counter() - start))
    (root / "pipeline.json").write_text(json.dumps(asdict(cfg), indent=2, default=str) + "\n")
    print(f"[pipeline] done in {time.perf_counter() - start:.0f}s; report: {report}", file=sys.stderr)
    return report


def rollout_stage(stages: Stages, cfg: PipelineConfig, suite: Suite) -> Path:
    """Episodes of RIR (and exploratory variants) on the suite's train variations."""
    from data_gen.rollout import RolloutConfig, rollout

    rc = RolloutConfig(
        env=suite.env,
        tasks=suite.tasks,
        split="train",
        variations=suite.train_variations,
        methods=["rir"],
        controller=["heuristic"],
        explore=cfg.explore,
        workers=cfg.workers,
        review_interval=cfg.review_interval,
        policy=suite.policy or cfg.policy,
        policy_mode=suite.policy_mode or cfg.policy_mode,
        error_rate=suite_error_rate(cfg, suite),
    )
    if suite.budget_agent:  # else the rollout default, a generous budget: data wants long branches
        rc = replace(rc, budget_agent=suite.budget_agent)
    if suite.budget_rollback is not None:  # else the rollout default: several recoveries a branch
        rc = replace(rc, budget_rollback=suite.budget_rollback)
    settings = _key_settings(rc, ROLLOUT_KEY)
    return stages.run(f"rollout-{suite.label}", settings, lambda d: rollout(replace(rc, out=str(d))))


def suite_error_rate(cfg: PipelineConfig, suite: Suite) -> float:
    return cfg.error_rate if suite.error_rate is None else suite.error_rate


def suite_label_values(cfg: PipelineConfig, rollouts: list[Path]) -> list[tuple[Path, str]]:
    """The rollout folders whose suite sets its own label value, with that value."""
    own = {f"rollout-{suite.label}": suite.label_value for suite in cfg.suites if suite.label_value}
    return [(path, own[path.name]) for path in rollouts if path.name in own]


def data_stage(stages: Stages, cfg: PipelineConfig, rollouts: list[Path]) -> Path:
    """Hindsight labels and the TRL datasets, from every suite's rollouts."""
    from data_gen.build import build

    bc = BuildConfig(
        rollouts=[str(p) for p in rollouts],
        max_prompt_tokens=cfg.max_prompt_tokens,
        tokenizer=cfg.base_model,
        label_value=cfg.label_value,
        run_label_values=[f"{path.name}={value}" for path, value in suite_label_values(cfg, rollouts)],
        value_rollouts=cfg.value_rollouts,
        value_max_steps=cfg.value_max_steps,
        review_ties=cfg.review_ties,
        bisect=cfg.bisect,
        val_fraction=cfg.val_fraction,
        value_pairs_per_point=cfg.value_pairs_per_point,
        workers=cfg.workers,
    )
    settings = _key_settings(bc, DATA_KEY)  # rollouts are inputs: their keys count
    return stages.run("data", settings, lambda d: build(replace(bc, out=str(d))), inputs=[p.name for p in rollouts])


def _length(cfg: PipelineConfig) -> list[str]:
    return ["--max_length", str(cfg.sft_max_length)] if cfg.sft_max_length else []


def sft_stage(stages: Stages, cfg: PipelineConfig, data: Path) -> Path:
    """The controller's LoRA adapter (resumes from its newest checkpoint after a kill)."""
    settings = {
        "base_model": cfg.base_model,
        "sft_config": yaml_settings(cfg.sft_config, "sft_config"),
        "sft_max_steps": cfg.sft_max_steps,
        "sft_max_length": cfg.sft_max_length,
        **({"train_seed": cfg.train_seed} if cfg.train_seed else {}),  # absent when kept: old caches stay valid
    }

    def fn(d: Path) -> None:
        _train(cfg, "sft", cfg.sft_config, d, data, cfg.sft_max_steps, _length(cfg))

    return stages.run("sft", settings, fn, inputs=[data.name])


def dpo_stage(stages: Stages, cfg: PipelineConfig, data: Path, sft: Path) -> Path:
    """Preference tuning from the SFT adapter."""
    settings = {"dpo_config": yaml_settings(cfg.dpo_config, "dpo_config"), "dpo_max_steps": cfg.dpo_max_steps}
    settings |= {"train_seed": cfg.train_seed} if cfg.train_seed else {}

    def fn(d: Path) -> None:
        extra = ["--sft_adapter", str(sft), *_length(cfg)]
        _train(cfg, "dpo", cfg.dpo_config, d, data, cfg.dpo_max_steps, extra)

    return stages.run("dpo", settings, fn, inputs=[data.name, sft.name])


def value_stage(stages: Stages, cfg: PipelineConfig, data: Path) -> Path:
    """The value controller: a scalar-head LoRA adapter trained on the data's option pairs."""
    settings = {
        "base_model": cfg.base_model,
        "value_config": yaml_settings(cfg.value_config, "value_config"),
        "value_max_train_steps": cfg.value_max_train_steps,
        **({"train_seed": cfg.train_seed} if cfg.train_seed else {}),
    }

    def fn(d: Path) -> None:
        _train(cfg, "value", cfg.value_config, d, data, cfg.value_max_train_steps, _length(cfg))

    return stages.run("value", settings, fn, inputs=[data.name])


def row_groups(cfg: PipelineConfig, rollouts: dict[str, Path]) -> dict[str, list[str]]:
    """Offline scores are reported apart for rows of the scripted expert and of a suite's own agent
    (the mistakes a learned controller should catch); with only one kind, all rows are one group."""
    groups: dict[str, list[str]] = {}
    for suite in cfg.suites:
        if suite.label in rollouts:
            own = PolicySpec.parse(suite.policy or cfg.policy).is_llm
            groups.setdefault("agent" if own else "expert", []).append(rollouts[suite.label].name)
    return groups if len(groups) > 1 else {"": []}


def controller_eval_stage(
    stages: Stages,
    cfg: PipelineConfig,
    data: Path,
    adapters: list[Path],
    specs: list[str],
    groups: dict[str, list[str]],
    trained: list[Path],
) -> Path:
    """Offline decision quality of the controllers on the validation split (the oracles have none), per
    row group; every adapter trained (SFT, then DPO) is scored, so the report says what DPO adds."""
    from eval.controller_eval import ControllerEvalConfig, evaluate_controllers

    cc = ControllerEvalConfig(
        data=str(data),
        controller=offline_controllers(specs, adapters),
        max_rows=cfg.controller_eval_rows,
        max_reflect_rows=cfg.controller_eval_reflect_rows,
    )

    def fn(d: Path) -> None:
        for name, source in groups.items():
            evaluate_controllers(replace(cc, source=source, out=str(d / name)))

    settings = {**_key_settings(cc, CONTROLLER_EVAL_KEY), "groups": groups}
    return stages.run("controller-eval", settings, fn, inputs=[data.name, *(a.name for a in trained)])


def offline_controllers(specs: list[str], adapters: list[Path]) -> list[str]:
    """The controllers scored offline: the online ones but the oracles (no offline decisions), with
    `tuned:` standing for every adapter trained; and the adapters where no online controller uses one
    (the quickstart runs only the value controller online), since a trained adapter goes unmeasured
    otherwise."""
    tuned = [f"tuned:{a}" for a in adapters]
    online = [ControllerSpec.parse(s) for s in specs]
    online = [s for s in online if not s.uses_hindsight]
    controllers = [c for s in online for c in (tuned if s.kind == "tuned" else [str(s)])]
    return controllers if any(s.arguments_of("tuned") for s in online) else controllers + tuned


def eval_stage(stages: Stages, cfg: PipelineConfig, suite: Suite, trained: list[Path], specs: list[str]) -> Path:
    """Methods x controllers on the suite's test variations."""
    from eval.harness import EvalConfig, evaluate

    ec = EvalConfig(
        env=suite.env,
        tasks=suite.tasks,
        split="test",
        variations=suite.test_variations,
        methods=cfg.eval_methods,
        controller=specs,
        budget_agent=suite.budget_agent or cfg.budget_agent,
        budget_rollback=cfg.budget_rollback if suite.budget_rollback is None else suite.budget_rollback,
        budget_controller=cfg.budget_controller,
        charge_controller=cfg.charge_controller,
        review_interval=cfg.review_interval,
        workers=cfg.workers,
        policy=suite.policy or cfg.policy,
        policy_mode=suite.policy_mode or cfg.policy_mode,
        error_rate=suite_error_rate(cfg, suite),
    )
    settings = _key_settings(ec, EVAL_KEY)
    return stages.run(
        f"eval-{suite.label}", settings, lambda d: evaluate(replace(ec, out=str(d))), inputs=[a.name for a in trained]
    )


# --- the final report -----------------------------------------------------------------------------------------
def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def pooled_rir_controllers(evals: list[dict[str, Any]]) -> dict[str, tuple[float, int, float]]:
    """Each RIR controller's (success rate, episodes, agent calls per episode), pooled over the suites."""
    pooled: dict[str, list[float]] = {}
    for summary in evals:
        for name, s in summary.get("methods", {}).items():
            method, _, controller = name.partition("/")
            if method == "rir" and controller:
                acc = pooled.setdefault(controller, [0.0, 0.0, 0.0])
                acc[0] += s["success_rate"] * s["episodes"]
                acc[1] += s["episodes"]
                acc[2] += s["agent_calls"] * s["episodes"]
    return {c: (wins / n, int(n), calls / n) for c, (wins, n, calls) in pooled.items() if n}


def headline(evals: list[dict[str, Any]]) -> list[str]:
    """The RIR controller comparison on the test split: the best controller against the others, then
    each trained controller against the heuristic and the prompted base, then the room (the oracles
    know the future: they bound the comparison, they do not enter it)."""
    pooled = pooled_rir_controllers(evals)
    contenders = {c: v for c, v in pooled.items() if not uses_hindsight(c)}
    if not contenders:
        return ["No RIR episodes were evaluated, so no controller comparison is available."]
    ranked = sorted(contenders, key=lambda c: -contenders[c][0])
    return (
        best_controller_line(ranked, contenders, evals)
        + trained_controller_lines(ranked, contenders, evals)
        + room_line(ranked, pooled, evals)
    )


def uses_hindsight(spec: str) -> bool:
    """Whether a controller, whole or composed, decides from hindsight (`oracle`, `oracle-agent`): an upper
    bound that knows the episode's future, never a contender for the headline."""
    parsed = ControllerSpec.try_parse(spec)
    return parsed is not None and parsed.uses_hindsight


def room_line(ranked: list[str], pooled: dict[str, tuple[float, int, float]], evals: list[dict[str, Any]]) -> list[str]:
    """Where `oracle-agent` ran beside the heuristic: the room over the rule (paired) and the share of it
    each trained controller took, the figure the learned controller is built to raise."""
    test = paired_pool(evals, ROOM_BOUND, ROOM_BASE) if ROOM_BOUND in pooled and ROOM_BASE in pooled else None
    if test is None:
        return []
    bound, base = pooled[ROOM_BOUND][0], pooled[ROOM_BASE][0]
    trained = [c for c in ranked if uses_trained_model(c)] if bound > base else []
    shares = ", ".join(f"`{c}` {(pooled[c][0] - base) / (bound - base):+.0%}" for c in trained)
    return [
        f"Room: `{ROOM_BOUND}` (hindsight from this agent's own continuations: an upper bound, not a contender) "
        f"{bound:.1%}, {(bound - base) * 100:+.1f} points over `{ROOM_BASE}` ({test.a_only} vs {test.b_only} "
        f"discordant, p = {test.p_value:.3g})" + (f"; share of it taken: {shares}." if shares else ".")
    ]


def best_controller_line(
    ranked: list[str], pooled: dict[str, tuple[float, int, float]], evals: list[dict[str, Any]]
) -> list[str]:
    """A winner is named only where the paired test says so: the best controller beats every other one
    at p < 0.05 (exact McNemar, pooled over the suites); otherwise "no significant difference", with
    the discordant counts. Agent calls never break a tie: a rule costs none, so a tie would always go
    to it."""
    best = ranked[0]

    def rate(c: str) -> str:
        return f"`{c}` {pooled[c][0]:.1%} ({pooled[c][2]:.1f} agent calls)"

    if len(ranked) == 1:
        return [f"Only `{best}` was evaluated with RIR: {pooled[best][0]:.1%} over {pooled[best][1]} test episodes."]
    tests = {c: paired_pool(evals, best, c) for c in ranked[1:]}
    counts = "; ".join(
        f"vs `{c}` {t.a_only} vs {t.b_only} discordant, p = {t.p_value:.3g}" for c, t in tests.items() if t
    )
    if tests and all(t is not None and t.significant and t.a_only > t.b_only for t in tests.values()):
        return [
            f"**Winner: `{best}`** with {pooled[best][0]:.1%} test success over {pooled[best][1]} RIR episodes "
            f"({pooled[best][2]:.1f} agent calls per episode), ahead of every other controller in paired "
            f"episodes: {counts}.",
            f"Others: {', '.join(rate(c) for c in ranked[1:])}.",
        ]
    return [
        f"**No significant difference** between the controllers on {pooled[best][1]} paired test episodes "
        f"each (exact McNemar, p >= 0.05 for at least one pair): {', '.join(rate(c) for c in ranked)}. "
        f"Paired, the highest rate {counts}.",
    ]


def uses_trained_model(spec: str) -> bool:
    """Whether a controller spec, whole or composed (`when=heuristic;where=value:<dir>;...`), serves an adapter."""
    parsed = ControllerSpec.try_parse(spec)
    return parsed is not None and parsed.uses_trained_model


def prompts_the_base_model(spec: str) -> bool:
    """Whether a controller spec prompts a model with no adapter of ours (the trained one's reference)."""
    parsed = ControllerSpec.try_parse(spec)
    return parsed is not None and bool(parsed.arguments_of("prompted")) and not parsed.uses_trained_model


def trained_controller_lines(
    ranked: list[str], pooled: dict[str, tuple[float, int, float]], evals: list[dict[str, Any]]
) -> list[str]:
    """Each trained controller (a form that serves a `tuned:` or `value:` adapter) against the rule and the
    prompted base (a form that serves only the base model), paired: what a user of the pipeline asks
    first, stated even where the trained controller is not the best."""
    references = [c for c in ranked if c == "heuristic" or prompts_the_base_model(c)]
    lines = []
    for trained in (c for c in ranked if uses_trained_model(c)):
        tests = [(ref, t) for ref in references if (t := paired_pool(evals, trained, ref))]
        if tests:
            lines.append(
                f"Trained controller `{trained}` ({pooled[trained][0]:.1%}): "
                + "; ".join(
                    f"vs `{ref}` ({pooled[ref][0]:.1%}) {t.a_only} vs {t.b_only} discordant, p = {t.p_value:.3g}"
                    for ref, t in tests
                )
                + "."
            )
    return lines


def paired_pool(evals: list[dict[str, Any]], a: str, b: str) -> PairedComparison | None:
    """Controller `a` against `b` in paired RIR episodes, pooled over the suites."""
    return combine(x for e in evals if (x := find_comparison(e, f"rir/{a}", f"rir/{b}")))


def offline_verdict(ce_dir: Path) -> list[str]:
    """Does the tuned adapter beat its base model offline (review F1, restore point exact)? Said plainly,
    once per row group."""
    folders = sorted(p.parent for p in ce_dir.glob(f"**/{CONTROLLER_EVAL}"))
    return [line for d in folders for line in _verdict(d, f" ({d.name} rows)" if d != ce_dir else "")]


def kind_of(controller: str) -> str:
    """The kind of a single-kind controller name ("" for a module swap or a name this rir does not know)."""
    parsed = ControllerSpec.try_parse(controller)
    return parsed.kind if parsed is not None else ""


def _verdict(ce_dir: Path, rows: str) -> list[str]:
    """The last adapter scored (DPO's, after SFT's) against the prompted base, whichever of them ran online."""
    results = _load(ce_dir / CONTROLLER_EVAL).get("results", [])
    tuned = next((r for r in reversed(results) if kind_of(r["controller"]) == "tuned"), None)
    base = next((r for r in results if kind_of(r["controller"]) == "prompted"), None)
    if not tuned or not base:
        return []
    better: list[str] = []
    worse: list[str] = []
    for key, label in (("review_f1", "review F1 (recover)"), ("where_exact", "restore point exact, end to end")):
        t, b = tuned.get(key), base.get(key)
        if t is not None and b is not None:
            (better if t > b else worse).append(f"{label} {t:.1%} vs {b:.1%}")
    if not better and not worse:
        return []
    where = f"Offline, on held-out variations{rows}"
    if not worse:
        return [f"{where}, the tuned adapter beats its base model: {'; '.join(better)}."]
    if not better:
        return [f"{where}, the tuned adapter does not beat its base model: {'; '.join(worse)}."]
    return [f"{where}, the tuned adapter beats its base model on {'; '.join(better)}, but not on {'; '.join(worse)}."]


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


SMOKE_ROWS = 50  # offline rows per dataset below which the offline section checks that scoring runs, no more


def smoke_note(cfg: PipelineConfig) -> str:
    """What the offline section can say on few rows: that the scoring runs, not which controller is better."""
    if cfg.controller_eval_rows >= SMOKE_ROWS:
        return ""
    return (
        f"a smoke test: {cfg.controller_eval_rows} held-out rows a dataset, too few for the intervals to tell "
        f"controllers apart; `--controller_eval_rows {4 * SMOKE_ROWS}` measures them"
    )


def _bound(cfg: PipelineConfig) -> str:
    return "unbounded" if cfg.budget_controller is None else str(cfg.budget_controller)


def final_report(
    cfg: PipelineConfig, ce_dir: Path, eval_dirs: list[Path], timings: dict[str, float], wall_s: float
) -> str:
    from eval.report import table

    evals = [_load(d / SUMMARY) for d in eval_dirs]
    smoke = smoke_note(cfg)
    lines = (
        ["# RIR pipeline report", ""]
        + headline(evals)
        + [line + (f" ({smoke})" if smoke else "") for line in offline_verdict(ce_dir)]
        + [
            "",
            f"Base model `{cfg.base_model}`, policy `{cfg.policy}` (error rate {cfg.error_rate}), "
            f"budgets B_agent={cfg.budget_agent}, B_rb={cfg.budget_rollback}, "
            + ("controller calls charged to B_agent" if cfg.charge_controller else f"B_ctrl={_bound(cfg)}")
            + f"; pipeline wall time {wall_s:.0f}s.",
            "",
        ]
    )
    evaluated = [suite for suite in cfg.suites if suite.test_variations]
    if len(evals) > 1:
        lines += ["## Main table (test split)", "", benchmark_table([s.label for s in evaluated], evals), ""]
    for suite, d, summary in zip(evaluated, eval_dirs, evals, strict=True):
        lines += [
            f"## Test split: {suite.label} (variations {suite.test_variations}, policy `{suite.policy or cfg.policy}`)",
            "",
            table(summary),
            "",
            f"Details: `{d / 'report.md'}`",
            "",
        ]
    for ce in sorted(ce_dir.glob("**/controller_eval.md")):
        title, _, table_text = ce.read_text().partition("\n\n")
        title = title.removeprefix("# Controller decision quality")
        lines += [f"## Offline decision quality {title}", ""] + (
            [f"*{smoke[0].upper()}{smoke[1:]}.*", ""] if smoke else []
        )
        lines += [table_text, ""]
    lines += ["## Stage wall times", "", "| stage | seconds |", "| --- | ---: |"]
    lines += [f"| {name} | {sec:.0f} |" for name, sec in timings.items()]
    return "\n".join(lines) + "\n"
