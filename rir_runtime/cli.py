"""The `rir` command: one entry point, one module per command.

`COMMANDS` is the table of every command: its name, the module that adds its parser and runs it, and
its one-line help. The table names modules, it does not import them: only the module of the command
being run is imported (`importlib`), so `rir --help` is instant and the runtime, at the bottom of the
project, imports nothing above it. Each command module has `add_parser(sub, name, help_text)`, which
adds the command's parser and sets its `handler` (the arguments -> an exit code).

Heavy imports (torch, transformers, Java) happen inside the handlers. Every error raised on purpose
(`RIRError`) becomes one line on stderr and exit code 2 (`rir_runtime.errors.exit_code`). Stage flags
follow TRL's spelling (`--max_steps`, dashes accepted): see `rir_runtime/orchestration/config.py`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from rir_runtime.errors import exit_code

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Handler = Callable[[argparse.Namespace], int | None]
C = TypeVar("C", bound="DataclassInstance")


@dataclass(frozen=True)
class Command:
    module: str  # the module whose `add_parser(sub, name, help_text)` adds the command
    help: str


COMMANDS: dict[str, Command] = {
    "envs": Command("rir_runtime.commands.envs", "list environments or check one against the contract"),
    "models": Command("rir_runtime.commands.models", "list registered models or prepare (convert) one"),
    "play": Command(
        "rir_runtime.commands.play",
        "play an environment yourself: type actions, :checkpoints, :rollback N, :expert, :quit",
    ),
    "run": Command(
        "eval.commands.run", "run one episode (first task, variation, method, seed) and print its transcript"
    ),
    "eval": Command(
        "eval.commands.eval",
        "evaluate methods x controllers x tasks x seeds at fixed budgets (optionally a budget sweep); "
        "writes episodes.jsonl, summary.json, report.md and plots",
    ),
    "eval-controller": Command(
        "eval.commands.eval_controller", "offline decision quality of controllers on held-out labelled datasets"
    ),
    "pipeline": Command(
        "eval.commands.pipeline",
        "every stage end to end (rollouts, labels, datasets, SFT/DPO, offline and downstream "
        "evaluation), cached; prints where the report is",
    ),
    "rollout": Command(
        "data_gen.commands.rollout",
        "generate controller data: RIR episodes (plus exploratory variants) with a base policy into "
        "an append-only, resumable run folder",
    ),
    "build-data": Command(
        "data_gen.commands.build_data",
        "label rollouts in hindsight and build TRL datasets (review/locate/reflect, SFT and preference)",
    ),
    "train": Command(
        "train.commands.train",
        "train a controller LoRA adapter (TRL SFT, DPO, GRPO, or the value model) or the agent (PEFT)",
    ),
    "mistakes": Command(
        "eval.commands.mistakes",
        "categorise an eval run's failures by their first fatal step (in "
        "hindsight) and check whether restores landed before them; writes mistakes.md",
    ),
    "view": Command(
        "eval.commands.view",
        "one self-contained HTML page of a run: report, episode index, branch trees, side by side",
    ),
    "export": Command(
        "eval.commands.export",
        "an eval run as Inspect AI logs (inspect view, samples_df) and a Hugging Face dataset with a .parquet file",
    ),
    "trace": Command("rir_runtime.commands.trace", "episode trace files: convert those written by an older rir"),
    "push": Command("train.commands.push", "publish an adapter or a dataset to the Hugging Face Hub (needs a token)"),
    "env": Command("rir_runtime.commands.env", "versions, devices, Java and caches for a bug report (like `trl env`)"),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `rir` parser. Of the commands, only the one `argv` names is loaded (its module imported, its
    flags added); the others are listed by name and help. Without `argv`, every command is loaded."""
    from rir_runtime.orchestration.config import FlagParser

    parser = FlagParser(
        prog="rir",
        description="Rollback-Induced Reflection: run agents with checkpoints and recovery, "
        "generate controller data, train and evaluate recovery controllers.",
    )
    parser.add_argument("--version", action="version", version=f"rir {package_version('rir')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")  # FlagParser too
    wanted = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), "")
    for name, command in COMMANDS.items():
        if wanted is None or name == wanted:
            importlib.import_module(command.module).add_parser(sub, name, command.help)
        else:
            sub.add_parser(name, help=command.help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Idle OpenMP threads spin by default; on a small shared CPU that makes 2 threads slower than 1.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return exit_code(args.handler, args)


def package_version(dist: str) -> str:
    """The installed version of a distribution, or why there is none."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        if dist == "rir":  # run from a checkout that was never pip-installed
            from rir_runtime import __version__

            return f"{__version__} (not installed)"
        return "not installed"


# --- what the commands share --------------------------------------------------------------------
def add_task_selection(p: argparse.ArgumentParser, env_positional: bool = True) -> None:
    """The flags that pick tasks by hand (`rir envs check`, `rir play`)."""
    if env_positional:
        p.add_argument("env", help="environment: builtin, scienceworld, textworld-cooking")
    p.add_argument("--tasks", default=None, help="comma list of task names (default: all for check, first for play)")
    p.add_argument("--split", default="dev", help="train, dev or test (default: dev)")
    p.add_argument("--variations", default="0", help="variation indices within the split: 0-9 or 0,3,5 (default: 0)")


SPELLING = (
    ". Flags take TRL's spelling (--max_steps) or dashes (--max-steps); lists take a,b or a b; "
    "--output_dir is another name of --out; booleans take --flag, --flag false or --no_flag."
)


def add_stage(
    sub: argparse._SubParsersAction, name: str, help_text: str, config_cls: type[DataclassInstance], handler: Handler
) -> None:
    """A pipeline stage's command: a typed config from `--config` YAML, with a flag per field overriding it."""
    from rir_runtime.orchestration.config import add_dataclass_arguments

    p = sub.add_parser(name, help=help_text, description=help_text + SPELLING)
    p.add_argument("--config", help="YAML file with the same keys as the flags (flags override it)")
    add_dataclass_arguments(p, config_cls, known_names())
    p.set_defaults(handler=handler)


def known_names() -> dict[str, list[str]]:
    """The names free-form fields know (methods, controllers, models), listed in their --help."""
    from rir_runtime.controllers.spec import spellings as controller_spellings
    from rir_runtime.llm.registry import MODELS
    from rir_runtime.policy_spec import spellings
    from rir_runtime.recovery import PRESETS

    methods, controllers = list(PRESETS), controller_spellings()
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


def stage_config(args: argparse.Namespace, config_cls: type[C]) -> C:
    """The stage's config from `--config` and its flags; typed by the class the handler names."""
    from rir_runtime.orchestration.config import parse_config

    return parse_config(config_cls, args)


if __name__ == "__main__":
    sys.exit(main())
