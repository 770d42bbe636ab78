"""`rir eval-controller`: offline decision quality of controllers on held-out labelled rows; prints the table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from eval.controller_eval import ControllerEvalConfig

    add_stage(sub, name, help_text, ControllerEvalConfig, run)


def run(args: argparse.Namespace) -> int:
    from eval.controller_eval import ControllerEvalConfig, evaluate_controllers

    cfg = stage_config(args, ControllerEvalConfig)
    evaluate_controllers(cfg)
    print((Path(cfg.out) / "controller_eval.md").read_text(), end="")
    return 0
