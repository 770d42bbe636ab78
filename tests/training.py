"""What the training tests share: the flags that make a run tiny and fast, datasets written in the exact
format `rir build-data` writes (TRL conversational prompt-completion and preference rows, `train`/`validation`
splits, a `meta` column), and the SFT/DPO argument parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rir_runtime.envs.checkpoints import Step
from rir_runtime.prompts import DecisionContext, render_decision

REPO = Path(__file__).resolve().parents[1]
FAST = [
    "--model",
    "tiny-random-llama",
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--dtype",
    "float32",
    "--gradient_checkpointing",
    "false",
    "--report_to",
    "none",
    "--dataloader_num_workers",
    "0",
    "--max_eval_samples",
    "6",
    "--logging_steps",
    "1",
    "--save_strategy",
    "no",
    "--eval_on_start",
    "false",
    "--disable_tqdm",
    "true",
]


def decision_prompt(kind: str, i: int) -> list[dict[str, str]]:
    """A rendered decision prompt of `kind`, its second step numbered `i` so rows differ."""
    steps = (Step(0, "take apple", "You take the apple.", 10.0), Step(1, f"chill apple {i}", "Done.", 20.0))
    ctx = DecisionContext(
        task="workshop-3",
        objective="Chill the apple.",
        memory="",
        history=steps,
        observation="Done.",
        score=20.0,
        admissible=(0, 1, 2),
        segments=((0, 3),),
        segment=(0, 3),
        restore_point=1,
    )
    return render_decision(kind, ctx, max_steps=2)  # type: ignore[arg-type]


ANSWERS = {  # decision type: (rendered kind, chosen, rejected)
    "review": ("review", '{"decision": "recover", "reason": "lost"}', '{"decision": "continue", "reason": ""}'),
    "locate": ("locate_fine", '{"step": 1}', '{"step": 2}'),
    "reflect": ("reflect", '{"env_knowledge": [], "milestones": [], "failure": null}', '{"env_knowledge": ["x"]}'),
}


PROMPT_BUDGET = 300  # what the test data's build.json says its prompts were fitted to


def write_data(root: Path, n_train: int = 8, n_val: int = 4, drop: tuple[str, str] | None = None) -> Path:
    """`<root>/<type>_sft` and `<type>_pref` DatasetDicts; `drop=(split|column, name)` breaks them."""
    from datasets import Dataset, DatasetDict

    def msg(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    for dtype, (kind, good, bad) in ANSWERS.items():
        for fmt in ("sft", "pref"):
            splits = {}
            for split, n in (("train", n_train), ("validation", n_val)):
                rows = []
                for i in range(n):
                    meta = {"env": "builtin", "task": "workshop-3", "decision": kind, "step": i}
                    tail = {"completion": msg(good)} if fmt == "sft" else {"chosen": msg(good), "rejected": msg(bad)}
                    rows.append({"prompt": decision_prompt(kind, i), **tail, "meta": meta})
                ds = Dataset.from_list(rows)
                if drop and drop[0] == "column" and drop[1] in ds.column_names:
                    ds = ds.remove_columns(drop[1])
                if not (drop and drop[0] == "split" and drop[1] == split):
                    splits[split] = ds
            DatasetDict(splits).save_to_disk(str(root / f"{dtype}_{fmt}"))
    (root / "build.json").write_text(json.dumps({"config": {"max_prompt_tokens": PROMPT_BUDGET}}))
    return root


def parse(stage: str, argv: list[str]) -> Any:
    """The parsed `rir train sft|dpo` arguments."""
    from train import dpo, sft
    from train.common.args import parse_train_args

    return parse_train_args((sft if stage == "sft" else dpo).make_parser(), argv)
