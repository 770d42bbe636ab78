"""`rir export`: an eval run as Inspect AI logs and a Hugging Face dataset (see eval/export.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    export = sub.add_parser(name, help=help_text)
    export.add_argument("run", help="a folder written by rir eval or rir rollout (holds episodes*.jsonl)")
    export.add_argument(
        "--format",
        required=True,
        choices=["inspect", "parquet", "all"],
        help="inspect: one Inspect AI .eval log per method and controller (needs inspect-ai); parquet: a "
        "Hugging Face dataset saved with save_to_disk and one .parquet file; all: both",
    )
    export.add_argument("--out", default=None, help="the folder to write into (default: <run>/export)")
    export.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from eval.export import export_run

    run_folder = Path(args.run)
    out = Path(args.out) if args.out else run_folder / "export"
    for path in export_run(run_folder, out, args.format):
        print(f"wrote {path}", file=sys.stderr)
    return 0
