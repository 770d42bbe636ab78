"""`rir trace upgrade`: convert a run folder's episode files written by an older rir."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    trace = sub.add_parser(name, help=help_text)
    trace_sub = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    upgrade = trace_sub.add_parser(
        "upgrade", help="convert a run folder's episodes*.jsonl from trace schema 1 (originals kept as .v1.bak)"
    )
    upgrade.add_argument("folder", help="a folder written by rir eval or rir rollout")
    upgrade.set_defaults(handler=upgrade_trace)


def upgrade_trace(args: argparse.Namespace) -> int:
    from rir_runtime.trace.upgrade import upgrade_run

    upgrade_run(Path(args.folder))
    return 0
