"""`rir rollout`: RIR episodes (plus exploratory variants) with a base policy, into a run folder."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from data_gen.rollout import RolloutConfig

    add_stage(sub, name, help_text, RolloutConfig, run)


def run(args: argparse.Namespace) -> int:
    from data_gen.rollout import RolloutConfig, rollout

    rollout(stage_config(args, RolloutConfig))
    return 0
