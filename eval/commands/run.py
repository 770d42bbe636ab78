"""`rir run`: one episode (the selection's first task, variation, method and seed), with its transcript."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from rir_runtime.orchestration.jobs import SelectionConfig

    add_stage(sub, name, help_text, SelectionConfig, run)


def run(args: argparse.Namespace) -> int:
    from eval.harness import run_one
    from rir_runtime.orchestration.jobs import SelectionConfig

    run_one(stage_config(args, SelectionConfig))
    return 0
