"""`rir pipeline`: every stage end to end, cached; prints where the report is."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_stage, stage_config


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    from eval.pipeline import PipelineConfig

    add_stage(sub, name, help_text, PipelineConfig, run)


def run(args: argparse.Namespace) -> int:
    from eval.pipeline import PipelineConfig, run_pipeline

    report = run_pipeline(stage_config(args, PipelineConfig))
    print(f"report: {report}")
    return 0
