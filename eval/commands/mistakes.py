"""`rir mistakes`: an eval run's failures by their first fatal step, and whether restores landed before it."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    mistakes = sub.add_parser(name, help=help_text)
    mistakes.add_argument(
        "--run", required=True, help="a folder written by rir eval or rir rollout (holds episodes*.jsonl)"
    )
    mistakes.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from eval.mistakes import main as mistakes_main

    return mistakes_main(args.run)
