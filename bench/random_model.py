"""A model folder with random weights of a real shape, so `rir train` can be timed on a GPU offline.

    python bench/random_model.py --tokenizer ~/.cache/rir/models/smollm2-135m-instruct --out /tmp/m135
    python bench/random_model.py --tokenizer ~/.cache/rir/models/smollm2-135m-instruct --shape 0.5b --out /tmp/q05
    rir train agent-sft --config configs/train/agent_sft_qwen2.5-0.5b.yaml --model /tmp/q05 ...

Why: throughput and memory depend on the shape alone, so a timed training run on this folder costs
what the real model would, where the weights cannot be fetched (a GPU machine without network).
Losses, adapters and actions from it mean nothing. The tokenizer and chat template are copied from
`--tokenizer`; `--shape same` (default) keeps that folder's own config (the packaged model's shape),
`0.5b`/`1.5b` take Qwen2.5's dimensions from bench/train_throughput.py (its larger vocabulary only
adds never-used rows, as Qwen's own padded vocabulary does; a smaller one grows to the tokenizer's).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from train_throughput import SHAPES, qwen_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def random_config(tokenizer_dir: Path, shape: str):  # -> PretrainedConfig
    from transformers import AutoConfig, AutoTokenizer

    if shape == "same":
        return AutoConfig.from_pretrained(tokenizer_dir)
    return qwen_config(shape, min_vocab=len(AutoTokenizer.from_pretrained(tokenizer_dir)))  # a row per token id


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, type=Path, help="model folder to take the tokenizer (and shape) from")
    p.add_argument("--shape", choices=["same", *SHAPES], default="same", help="model dimensions (default: same)")
    p.add_argument("--out", required=True, type=Path, help="folder to write")
    args = p.parse_args(argv)
    if not (args.tokenizer / "tokenizer.json").is_file():
        p.error(f"{args.tokenizer} holds no tokenizer.json: pass a model folder, e.g. .cache/rir/models/<name>")
    from transformers import AutoModelForCausalLM

    config = random_config(args.tokenizer, args.shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        if (args.tokenizer / name).is_file():
            shutil.copy(args.tokenizer / name, args.out / name)
    n = sum(t.numel() for t in model.parameters())
    print(f"{args.out}: {config.model_type}, {n / 1e6:.0f}M parameters, random weights (shape {args.shape})")


if __name__ == "__main__":
    main()
