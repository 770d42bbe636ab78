"""`rir build-data`: hindsight labels of rollouts, and the TRL datasets built from them."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from data_gen.build_config import BuildConfig

    add_stage(sub, name, help_text, BuildConfig, run)


def run(args: argparse.Namespace) -> int:
    from data_gen.build import build
    from data_gen.build_config import BuildConfig

    build(stage_config(args, BuildConfig))
    return 0
