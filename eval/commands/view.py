"""`rir view`: one self-contained HTML page of a run."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    view = sub.add_parser(name, help=help_text)
    view.add_argument("run", help="a folder written by rir eval or rir rollout (holds episodes*.jsonl)")
    view.add_argument("--episode", default=None, help="render only this episode id (with its side-by-side view)")
    view.add_argument("--out", default=None, help="where to write the page (default: <run>/view.html)")
    view.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from eval.view import main as view_main

    return view_main(args.run, args.episode, args.out)
