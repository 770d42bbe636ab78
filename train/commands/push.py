"""`rir push adapter|dataset`: publish an adapter or a dataset folder to the Hugging Face Hub."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    push = sub.add_parser(name, help=help_text)
    kinds = push.add_subparsers(dest="push_kind", required=True, metavar="WHAT")
    for kind, what in (
        ("adapter", "an adapter folder of rir train"),
        ("dataset", "one dataset folder of rir build-data"),
    ):
        p = kinds.add_parser(kind, help=f"push {what}")
        p.add_argument("folder", help=what)
        p.add_argument("repo_id", help="the Hub repository, e.g. you/rir-controller")
        p.add_argument("--public", action="store_true", help="make the repository public (default: private)")
        p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from train.hub import push_adapter, push_dataset

    push = push_adapter if args.push_kind == "adapter" else push_dataset
    url = push(args.folder, args.repo_id, private=not args.public)
    print(f"pushed {args.folder} to {url}")
    return 0
