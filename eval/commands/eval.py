"""`rir eval`: methods x controllers x tasks x seeds at fixed budgets; prints the summary table."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from eval.harness import EvalConfig

    add_stage(sub, name, help_text, EvalConfig, run)


def run(args: argparse.Namespace) -> int:
    from eval.harness import EvalConfig, evaluate
    from eval.report import table

    summary = evaluate(stage_config(args, EvalConfig))
    print(table(summary))
    return 0
