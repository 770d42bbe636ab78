"""The value controller's model: the base model with a LoRA adapter, trained on the option pairs of
`rir build-data` (`value_pref`) with one of two heads (`value_head`):

- `scalar`: a scalar head, TRL's `RewardTrainer` on the pairs (Bradley-Terry over option scores);
- `lm`: the language model's own head, TRL's `SFTTrainer` on each decision point's best option as the
  reply to its prompt; an option then scores the log-probability of its text. That head already
  copies text it read, and naming the step to undo is copying the action the trajectory shows
  wrong: on the workshop it made a Where that beats the rule's, where the scalar head did not.

`decision_types: [locate]` trains either head on the Where's decisions alone (`where_rows`).

# CPU (packaged SmolLM2-135M-Instruct)
```bash
rir train value --config configs/train/value_controller_cpu.yaml --data runs/decisions-cpu/data --output_dir runs/value
rir train value --config configs/train/value_lm_cpu.yaml --data runs/where-data --output_dir runs/value-where  # lm head
```

# One GPU / many GPUs
```bash
rir train value --launcher accelerate --accelerate-config configs/accelerate/multi_gpu.yaml \
    --config configs/train/value_qwen2.5-0.5b.yaml --data data/controller
```

For the scalar head a row is a decision's trajectory prompt with two of its options, the one of
higher hindsight value chosen; the model learns a score per option whose differences rank them
(Bradley-Terry). Prompt and option are tokenised apart and joined (`rir_runtime.llm.value.encode`),
exactly as the controller serves them, so the prompt's key/value cache can be shared by every option
at inference. After
training, the margin over going on that a recovery must beat is calibrated on the review rows of
the data's calibration split (`review_threshold` in the card, as for a generative adapter), and
the adapter serves as `--controller value:<dir>`.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from data_gen.build_record import read_build_record
from data_gen.scoring.answers import share_by_source
from rir_runtime.errors import UserInputError
from rir_runtime.llm.card import LM
from rir_runtime.prompts import prompt_format_version
from train.common.args import TrainScriptArguments

VALUE_DATASET = "value_pref"
VALUE_DECISIONS = ["review", "locate"]  # the value controller is a When and a Where


def value_decisions(script_args: TrainScriptArguments) -> list[str]:
    """The decisions the value model learns, of `decision_types`: review and locate (every decision point:
    the When and the Where), or locate alone (the Where's decisions only: points where a recovery is
    best, pairs between two recoveries; served as `value:<dir>`, such an adapter leaves the When to the
    rule). A review alone is refused: a review weighs the best recovery, so it needs the Where too."""
    chosen = [t for t in VALUE_DECISIONS if t in script_args.decision_types]
    if "locate" not in chosen:
        raise UserInputError(
            f"decision_types {script_args.decision_types}: a value model learns [review, locate] (When and Where) "
            "or [locate] (the Where alone); a review compares the best recovery with going on, so it needs locate"
        )
    return chosen


def where_rows(metas: list[dict[str, Any]], lm_head: bool) -> list[int]:
    """Indices of the rows that teach the Where: for the lm head, points whose best option is a recovery;
    for pairs, pairs between two recoveries."""
    if lm_head:
        return [i for i, m in enumerate(metas) if m["chosen_option"] != -1]
    return [i for i, m in enumerate(metas) if m["chosen_option"] != -1 and m["rejected_option"] != -1]


def main(script_args: TrainScriptArguments, training_args, model_args):
    """Train and save the adapter into output_dir; returns the trainer (state, logs, model)."""
    from train.common.run import train_and_save

    trainer, card = build_trainer(script_args, training_args, model_args)
    return train_and_save(trainer, card, script_args, training_args, model_args)


def value_folder(data: str) -> Path:
    """The `value_pref` folder of a build (or the folder itself), or the error that says how to make it."""
    root = Path(data).expanduser()
    folder = root if root.name == VALUE_DATASET else root / VALUE_DATASET
    if not (folder / "dataset_dict.json").is_file():
        raise UserInputError(
            f"{root} holds no {VALUE_DATASET} dataset: build one with `rir build-data --out {root}` "
            "(value_pairs_per_point > 0; with agent values also --no_bisect)"
        )
    build = read_build_record(folder)
    built, current = build.get("value_prompt_version"), prompt_format_version("value")
    if build and built != current:  # the adapter's card would claim the runtime's texts, not the data's
        raise UserInputError(
            f"{root} was built with value prompts of version {built or 'unrecorded'}, but this runtime renders "
            f"version {current} (its option texts): rebuild it with `rir build-data` from the same rollouts"
        )
    return folder


def tokenized(dataset: Any, tokenizer: Any, max_length: int | None) -> Any:
    """`chosen_ids` / `rejected_ids` as the value model is served (prompt and option tokenised apart),
    rows over `max_length` dropped; TRL's RewardTrainer takes such processed rows as they are."""
    from rir_runtime.llm.value import encode

    def encode_row(row: dict[str, Any]) -> dict[str, list[int]]:
        prompt, chosen = encode(tokenizer, row["prompt"], row["chosen"])
        _, rejected = encode(tokenizer, row["prompt"], row["rejected"])
        return {"chosen_ids": prompt + chosen, "rejected_ids": prompt + rejected}

    out = dataset.map(encode_row, remove_columns=dataset.column_names)
    if max_length:
        out = out.filter(lambda r: max(len(r["chosen_ids"]), len(r["rejected_ids"])) <= max_length)
    return out


def value_splits(script_args: TrainScriptArguments) -> tuple[Path, Any, dict[str, str]]:
    """(the value_pref folder, its DatasetDict, the fingerprints of the train and eval splits), or the
    error that names a missing split."""
    from train.common.data import load_dataset_dict

    folder = value_folder(script_args.data)
    splits = load_dataset_dict(folder)
    for split in (script_args.train_split, script_args.eval_split):
        if split not in splits:
            raise UserInputError(f"{folder} has no '{split}' split (it has {list(splits)}): rebuild it")
    fingerprints = {
        f"{VALUE_DATASET}/{s}": splits[s]._fingerprint for s in (script_args.train_split, script_args.eval_split)
    }
    return folder, splits, fingerprints


def load_pairs(script_args: TrainScriptArguments, tokenizer: Any, max_length: int | None, seed: int) -> tuple[Any, ...]:
    """(train, eval, fingerprints): the value pairs, shuffled (the train pairs balanced by contrast where
    asked), capped, tokenised: only the rows trained on are tokenised."""
    _, splits, fingerprints = value_splits(script_args)

    if script_args.balance_pairs and script_args.balance_sources:
        raise UserInputError("balance_pairs and balance_sources each pick the value pairs: set one of them")
    if script_args.balance_sources and not script_args.max_train_samples:
        raise UserInputError("balance_sources shares max_train_samples between the rollout folders: set it too")

    where_only = value_decisions(script_args) == ["locate"]

    def take(split: str, cap: int | None, train: bool = False) -> Any:
        ds = splits[split]
        if where_only:
            ds = ds.select(where_rows(list(ds["meta"]), lm_head=False))
        if train and script_args.balance_pairs:
            return tokenized(ds.select(balanced_pairs(list(ds["meta"]), cap, seed)), tokenizer, max_length)
        ds = ds.shuffle(seed=seed)
        if train and script_args.balance_sources and cap:  # shuffled alone, 40 steps of 8 saw 28 pairs off the workshop
            return tokenized(ds.select(share_by_source(list(ds["meta"]), cap)), tokenizer, max_length)
        return tokenized(ds.select(range(min(cap, len(ds)))) if cap else ds, tokenizer, max_length)

    return (
        take(script_args.train_split, script_args.max_train_samples, train=True),
        take(script_args.eval_split, script_args.max_eval_samples),
        fingerprints,
    )


CONTRASTS = ("recover", "go on", "where")


def contrast(meta: dict[str, Any]) -> str:
    """Which decision a pair teaches: a recovery beats going on, going on beats a recovery (When), or
    one checkpoint beats another (Where)."""
    if meta["rejected_option"] == -1:
        return "recover"
    return "go on" if meta["chosen_option"] == -1 else "where"


def balanced_pairs(metas: list[dict[str, Any]], cap: int | None, seed: int) -> list[int]:
    """Row indices with the three contrasts in equal shares (a contrast with too few rows lends its share
    to the others), in a seeded random order. Where going on wins, a point's pairs set it against each
    checkpoint; only the latest (the hardest: the recovery that would undo least) is kept, so the When
    is learnt where it is decided. Without a cap, as many of each as the rarest contrast has."""
    kinds: dict[str, list[int]] = {k: [] for k in CONTRASTS}
    latest: dict[tuple[str, int], int] = {}  # decision point -> its go-on pair against the latest checkpoint
    for i, meta in enumerate(metas):
        kind = contrast(meta)
        if kind != "go on":
            kinds[kind].append(i)
            continue
        point = (meta["episode_id"], int(meta["step"]))
        if point not in latest or meta["rejected_option"] > metas[latest[point]]["rejected_option"]:
            latest[point] = i
    kinds["go on"] = sorted(latest.values())
    rng = random.Random(seed)
    for rows in kinds.values():
        rng.shuffle(rows)
    present = [rows for rows in kinds.values() if rows]
    if not present:
        return []
    total = cap if cap else len(present) * min(len(rows) for rows in present)
    picked: list[int] = []
    for n, rows in enumerate(sorted(present, key=len)):  # the rarest first: what it lacks, the others fill
        share = (total - len(picked)) // (len(present) - n)
        picked += rows[:share]
    rng.shuffle(picked)
    return picked


def best_option_rows(pairs: Any) -> list[dict[str, Any]]:
    """One row per decision point of the value pairs: its prompt, its best option (the `chosen` of
    every pair of the point, `ranked_pairs`) and the `meta` of its first pair, in order of first appearance."""
    rows: dict[str, dict[str, Any]] = {}
    for prompt, chosen, meta in zip(pairs["prompt"], pairs["chosen"], pairs["meta"], strict=True):
        rows.setdefault(prompt, {"prompt": prompt, "option": chosen, "meta": meta})
    return list(rows.values())


def load_best_options(script_args: TrainScriptArguments, tokenizer: Any, max_length: int | None, seed: int):
    """(train, eval, fingerprints) for the language-model head: each point's prompt as one user turn and its
    best option as the reply, TRL's conversational prompt-completion rows; shuffled, capped by points
    (`max_train_samples` shared by the rollout folders where `balance_sources`), overlong prompts dropped."""
    from datasets import Dataset

    from rir_runtime.llm.value import as_chat
    from train.common.data import drop_overlong

    folder, splits, fingerprints = value_splits(script_args)
    where_only = value_decisions(script_args) == ["locate"]

    def take(split: str, cap: int | None, by_source: bool) -> Any:
        points = best_option_rows(splits[split])
        if where_only:
            points = [points[i] for i in where_rows([p["meta"] for p in points], lm_head=True)]
        random.Random(seed).shuffle(points)
        if cap and by_source:
            points = [points[i] for i in share_by_source([p["meta"] for p in points], cap)]
        elif cap:
            points = points[:cap]
        rows = {
            "prompt": [as_chat(p["prompt"]) for p in points],
            "completion": [[{"role": "assistant", "content": p["option"]}] for p in points],
        }
        return drop_overlong(Dataset.from_dict(rows), tokenizer, max_length, split)

    train = take(script_args.train_split, script_args.max_train_samples, script_args.balance_sources)
    if len(train) == 0:
        raise UserInputError(
            f"{folder} has no {script_args.train_split} decision point to learn from"
            + (" with a recovery as its best option" if where_only else "")
            + ": build data from more rollouts (more task variations, or a higher error_rate)"
        )
    return train, take(script_args.eval_split, script_args.max_eval_samples, False), fingerprints


def sft_arguments(training_args: Any) -> Any:
    """The value stage's RewardConfig as an SFTConfig for the lm head: the fields both share (TRL's own
    conversion passes every field, and SFTConfig refuses the reward-only ones); loss on the option only."""
    from dataclasses import fields

    from trl import SFTConfig

    names = {f.name for f in fields(SFTConfig) if f.init}
    shared = {k: v for k, v in training_args.to_dict().items() if k in names}
    for key in [k for k in shared if k.endswith("_token")]:  # to_dict masks these ("<EOS_TOKEN>")
        shared[key] = getattr(training_args, key)
        if shared[key] is None:  # unset: SFTConfig warns of a deprecated pad_token when it is passed at all
            del shared[key]
    return SFTConfig(**{**shared, "completion_only_loss": True})


def build_trainer(script_args: TrainScriptArguments, training_args, model_args):
    """(the trainer of the value model, the adapter card's fields): RewardTrainer with a fresh LoRA
    adapter on a scalar-head model, or for the lm head SFTTrainer on each point's best option. The
    launch, the data and the decisions to learn are checked first, before a base model is converted."""
    from train.common.distributed import check_launch

    check_launch(training_args)
    value_folder(script_args.data)
    value_decisions(script_args)
    if script_args.value_head == LM and script_args.balance_pairs:
        raise UserInputError("balance_pairs picks option pairs; the lm value head trains on each point's best option")
    if script_args.value_head == LM:
        return build_lm_trainer(script_args, training_args, model_args)
    return build_scalar_trainer(script_args, training_args, model_args)


def build_scalar_trainer(script_args: TrainScriptArguments, training_args, model_args):
    """(RewardTrainer with a fresh LoRA adapter on a scalar-head model, the adapter card's fields)."""
    from transformers import set_seed
    from trl import RewardTrainer

    from train.common.distributed import main_process_first
    from train.common.models import lora_config, resolve_base

    with main_process_first(training_args, "preparing the model and datasets"):
        base_name, base_path = resolve_base(script_args, model_args)
        tokenizer = value_tokenizer(base_path)
        train_ds, eval_ds, fingerprints = load_pairs(
            script_args, tokenizer, training_args.max_length, training_args.seed
        )
    set_seed(training_args.seed)  # the fresh head is drawn here, before the Trainer seeds anything
    model = scalar_head_model(base_path, tokenizer, model_args)
    model_args.use_peft, model_args.lora_task_type = True, "SEQ_CLS"  # LoRA settings come from ModelConfig
    peft_config = lora_config(model, model_args, base_name, script_args.lora_top_layers)
    need_eval = training_args.eval_strategy != "no" or training_args.eval_on_start
    trainer = RewardTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds if need_eval else None,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    return trainer, value_card(script_args, base_name, base_path, fingerprints)


def build_lm_trainer(script_args: TrainScriptArguments, training_args, model_args):
    """(SFTTrainer with a fresh LoRA adapter on the base language model, the adapter card's fields). The
    model learns to name the best option of each decision point; served, it scores every option by the
    log-probability of its text (`rir_runtime.llm.value.LikelihoodScorer`)."""
    from trl import SFTTrainer

    from train.common.setup import set_up

    sft_args = sft_arguments(training_args)

    def load(tokenizer: Any, need_eval: bool):
        train_ds, eval_ds, fingerprints = load_best_options(script_args, tokenizer, sft_args.max_length, sft_args.seed)
        return train_ds, eval_ds if need_eval else None, fingerprints, value_decisions(script_args)

    setup = set_up(script_args, sft_args, model_args, load)
    trainer = SFTTrainer(**setup.trainer_arguments(sft_args))
    return trainer, value_card(script_args, setup.base_name, setup.base_path, setup.fingerprints)


def value_card(script_args: TrainScriptArguments, base_name: str, base_path: str, fingerprints: dict) -> dict:
    """The adapter card's fields of a value model: its head, the decisions it learnt, whose values ranked them."""
    return dict(
        base_model=base_name,
        base_model_path=base_path,
        decision_types=value_decisions(script_args),
        fingerprints=fingerprints,
        stage="value",
        kind="value",
        extra={"label_values": label_values(script_args.data), "value_head": script_args.value_head},
    )


def value_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token_id is None:
        raise UserInputError(f"the tokenizer of {path} has neither a padding nor an end-of-text token to pad with")
    return tokenizer


def scalar_head_model(path: str, tokenizer: Any, model_args: Any) -> Any:
    """The base model with a fresh scalar head (`num_labels=1`), its pad token set as TRL expects."""
    from transformers import AutoModelForSequenceClassification

    from rir_runtime.llm.tuned import quiet_loading

    try:
        with quiet_loading():  # "score.weight newly initialized": the head is what we train
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=model_args.dtype or "auto"
            )
    except OSError as err:
        raise UserInputError(f"cannot load base model {path}: {str(err).splitlines()[0]}") from None
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def label_values(data: str) -> dict[str, Any]:
    """Whose values ranked the options (the build's label_value, per rollout folder where it differs)."""
    build = read_build_record(data)
    if not build:
        return {}
    config = build.get("config", {})
    return {"label_value": config.get("label_value"), "run_label_values": config.get("run_label_values", [])}


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import ModelConfig, RewardConfig, TrlParser

    dataclass_types: tuple[Any, ...] = (TrainScriptArguments, RewardConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("value", help="train a value controller adapter", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    import sys

    from train.common.args import run_script

    sys.exit(run_script(main, make_parser(prog="python -m train.value")))
