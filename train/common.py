"""Pieces shared by `train/sft.py` and `train/dpo.py`.

- script arguments (the `data` / `decision_types` / `model` half of a train config; the rest is
  TRL's `SFTConfig`/`DPOConfig` and `ModelConfig`),
- parsing with `TrlParser.parse_args_and_config`, plus an unknown-key check with a suggestion,
- resolving the model name through the registry and checking LoRA targets against the model,
- loading the datasets `rir build-data` writes, with clear errors for a missing split or column,
- the adapter card `rir_controller.json` that `rir_runtime.tuned` validates at load time,
- turning an out-of-memory crash into advice.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata as md
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rir_runtime.errors import RIRError, UserInputError

logger = logging.getLogger(__name__)

DECISION_TYPES = ("review", "locate", "reflect")
AGENT = "agent"  # the behaviour-cloned base policy (`rir train agent-sft`): its own adapter kind
COLUMNS = {"sft": ("prompt", "completion"), "pref": ("prompt", "chosen", "rejected")}
RESOLVED_CONFIG = "rir_train_config.json"


class TrainingResourceError(RIRError):
    """Training ran out of a resource (memory); the message says which setting to reduce."""


# --- script arguments ---------------------------------------------------------------------------
@dataclass
class TrainScriptArguments:
    """What to train on and from; everything else is TRL's SFTConfig/DPOConfig and ModelConfig."""

    data: str = field(
        default="data/controller",
        metadata={
            "help": "folder written by `rir build-data` (holding review_sft/, locate_sft/, ... ) or one dataset folder"
        },
    )
    decision_types: list[str] = field(
        default_factory=lambda: list(DECISION_TYPES),
        metadata={
            "help": "decision types to train on, mixed into one dataset (space separated; a YAML list)",
            "choices": [*DECISION_TYPES, AGENT],
        },
    )
    model: str | None = field(
        default=None,
        metadata={
            "help": "base model: registry name (smollm2-135m-instruct, tiny-random-llama, ...), local folder "
            "or hub id; defaults to model_name_or_path"
        },
    )
    train_split: str = field(default="train", metadata={"help": "split to train on"})
    eval_split: str = field(default="validation", metadata={"help": "split to evaluate on during training"})
    max_train_samples: int | None = field(default=None, metadata={"help": "cap on training rows (after shuffling)"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "cap on evaluation rows (after shuffling)"})

    def __post_init__(self) -> None:
        items = [self.decision_types] if isinstance(self.decision_types, str) else self.decision_types
        types = [t.strip() for item in items for t in str(item).split(",") if t.strip()]
        bad = [t for t in types if t not in (*DECISION_TYPES, AGENT)]
        if bad or not types:
            raise UserInputError(
                f"decision_types {bad or '[]'} invalid: choose from {', '.join(DECISION_TYPES)} "
                f"(or '{AGENT}' alone for the behaviour-cloned agent)"
            )
        if AGENT in types and len(types) > 1:
            raise UserInputError(
                "the agent policy and the recovery controller are separate adapters: train "
                f"decision_types [{AGENT}] alone (`rir train agent-sft`), and the controller without it"
            )
        self.decision_types = list(dict.fromkeys(types))


# --- config parsing -----------------------------------------------------------------------------
def _option_names(parser: Any) -> dict[str, str]:
    """{key as written in YAML or after --: dest} for every option of the parser."""
    names: dict[str, str] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--"):
                names[opt[2:]] = action.dest
    return names


def _unknown(key: str, valid: Sequence[str], where: str) -> UserInputError:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return UserInputError(f"unknown key '{key}' in {where}.{hint} See `rir train sft --help` for every key.")


def check_config_keys(parser: Any, config_path: str) -> None:
    """Unknown YAML keys are errors naming the key and the nearest valid one (TrlParser only lists
    them, and HfArgumentParser would otherwise take a misspelt key as a silent no-op)."""
    from rir_runtime.config import load_yaml

    config = load_yaml(config_path)  # the one YAML reader: missing file, bad syntax, not a mapping
    dests = {a.dest for a in parser._actions}
    for key in config:
        if key != "env" and key not in dests:
            raise _unknown(str(key), sorted(dests), f"config {config_path}")


def parse_train_args(parser: Any, argv: Sequence[str] | None = None) -> tuple[Any, ...]:
    """`parser.parse_args_and_config(argv)` with our errors: unknown keys (YAML or flags) name the
    nearest valid key. Dashed flags (--output-dir, --max-steps) are HfArgumentParser aliases."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    valid = set(_option_names(parser)) | {"config"}
    for arg in args:  # before parsing: HfArgumentParser builds (and validates) the configs first
        key = arg.split("=", 1)[0][2:]
        if arg.startswith("--") and key not in valid:
            raise _unknown(key, sorted(valid), "command-line flags")
    if "--config" in args:
        i = args.index("--config")
        if i + 1 >= len(args):
            raise UserInputError("--config needs a YAML file path")
        check_config_keys(parser, args[i + 1])
    try:
        return parser.parse_args_and_config(args)
    except ValueError as err:
        text = str(err)
        hint = (
            " (on a CPU: --use_cpu true --bf16 false, or start from configs/train/sft_cpu_quick.yaml)"
            if "bf16" in text
            else ""
        )
        raise UserInputError(f"invalid training arguments: {text}{hint}") from None


def run_script(main: Any, parser: Any, argv: Sequence[str] | None = None) -> int:
    """`python -m train.sft|dpo`: parse, train; our errors become one line and exit code 2."""
    import sys

    try:
        main(*parse_train_args(parser, argv))
    except RIRError as err:
        print(f"rir: error: {err}", file=sys.stderr)
        return 2
    return 0


# --- models -------------------------------------------------------------------------------------
def resolve_base(script_args: TrainScriptArguments, model_args: Any) -> tuple[str, str]:
    """(name as given, local path or hub id) of the base model; the registry prepares packaged models."""
    from rir_runtime.llm.registry import local_path

    name = script_args.model or model_args.model_name_or_path
    if not name:
        raise UserInputError(
            "no base model: pass --model (a registry name such as smollm2-135m-instruct, "
            "a local folder or a hub id) or set `model:` in the config"
        )
    model_args.model_name_or_path = str(local_path(name))
    return name, model_args.model_name_or_path


def load_base_model(path: str, model_args: Any, training_args: Any) -> Any:
    """The base causal LM, loaded the way TRL loads one from a name (dtype, attention kernel)."""
    from trl.trainer.utils import create_model_from_path

    kwargs: dict[str, Any] = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype or "auto",
        device_map=None,
    )  # the Trainer (or accelerate under DDP/FSDP) places it
    kwargs.update(training_args.model_init_kwargs or {})
    try:
        return create_model_from_path(path, **kwargs)
    except OSError as err:
        raise UserInputError(f"cannot load base model {path}: {str(err).splitlines()[0]}") from None


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise UserInputError(
            f"the tokenizer of {path} has no chat template; controller prompts are chat messages. "
            "Use an instruct model, or a registry model (which gets a default template)"
        )
    return tokenizer


def linear_module_names(model: Any) -> list[str]:
    """Leaf names of the model's linear layers (what `lora_target_modules` can name)."""
    import torch

    kinds: tuple[type, ...] = (torch.nn.Linear,)
    with contextlib.suppress(ImportError):
        from transformers.pytorch_utils import Conv1D

        kinds += (Conv1D,)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, kinds) and n})


def check_lora_targets(model: Any, peft_config: Any, model_name: str) -> None:
    """Every named target must be a module of the model; else list the linear layers it does have."""
    targets = getattr(peft_config, "target_modules", None)
    if targets is None or isinstance(targets, str):  # PEFT defaults, 'all-linear', or a regex
        return
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserInputError(
            f"lora_target_modules {sorted(missing)} are not modules of {model_name}. Its linear layers are: "
            f"{', '.join(linear_module_names(model))}. Fix lora_target_modules (or use all-linear)."
        )


# --- datasets -----------------------------------------------------------------------------------
def _load_dict(folder: Path) -> Any:
    from datasets import Dataset, DatasetDict, load_from_disk

    try:
        # In memory: TRL's .map() caches would otherwise be written into the data folder.
        dd = load_from_disk(str(folder), keep_in_memory=True)
    except (FileNotFoundError, ValueError) as err:
        reason = str(err).splitlines()[0]
        raise UserInputError(f"{folder} is not a dataset saved by `rir build-data` ({reason})") from None
    if isinstance(dd, Dataset):
        raise UserInputError(
            f"{folder} holds one Dataset without splits; it needs a DatasetDict with 'train' and "
            "'validation' splits: rebuild it with `rir build-data`"
        )
    assert isinstance(dd, DatasetDict)
    return dd


def _check_rows(name: str, folder: Path, ds: Any, kind: str) -> None:
    """Column and message-format checks on the first row (the builder writes all rows alike)."""
    have = set(ds.column_names)
    missing = [c for c in COLUMNS[kind] if c not in have]
    if missing:
        other = "pref" if kind == "sft" else "sft"
        if all(c in have for c in COLUMNS[other]):
            cmd = "dpo" if other == "pref" else "sft"
            raise UserInputError(
                f"{folder} is a {'preference' if other == 'pref' else 'SFT'} dataset (columns "
                f"{sorted(have)}); train it with `rir train {cmd}`, or pass the *_{kind} folder"
            )
        raise UserInputError(
            f"dataset {folder} lacks column(s) {missing} (it has {sorted(have)}); "
            f"{kind} training needs {list(COLUMNS[kind])} in TRL's conversational format: "
            "rebuild it with `rir build-data`"
        )
    if len(ds) == 0:
        return
    row = ds[0]
    prompt = row["prompt"]
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt)):
        raise UserInputError(
            f"dataset {folder}: 'prompt' must be a list of chat messages ({{role, content}}); "
            "rebuild it with `rir build-data`"
        )
    for col in COLUMNS[kind][1:]:
        msgs = row[col]
        if not (isinstance(msgs, list) and len(msgs) == 1 and msgs[0].get("role") == "assistant"):
            raise UserInputError(
                f"dataset {folder}: '{col}' must be a list with one assistant message; rebuild it with `rir build-data`"
            )


def dataset_folders(data: str, kind: str, decision_types: Sequence[str]) -> dict[str, Path]:
    """{dataset name: folder}. `data` is the build-data output folder, or one dataset folder."""
    root = Path(data).expanduser()
    if not root.is_dir():
        raise UserInputError(
            f"--data {root} is not a folder: pass the --out folder of `rir build-data` "
            f"(holding {', '.join(f'{t}_{kind}' for t in DECISION_TYPES)}) or one of those folders"
        )
    if (root / "dataset_dict.json").is_file():
        return {root.name: root}
    folders = {f"{t}_{kind}": root / f"{t}_{kind}" for t in decision_types}
    missing = [n for n, f in folders.items() if not f.is_dir()]
    if missing:
        present = sorted(p.name for p in root.iterdir() if (p / "dataset_dict.json").is_file())
        raise UserInputError(
            f"{root} has no dataset folder(s) {missing} (it has: {', '.join(present) or 'none'}); "
            "run `rir build-data --out` into it, or choose decision_types among those present"
        )
    return folders


def decision_types_of(names: Sequence[str]) -> list[str]:
    found = [t for t in (*DECISION_TYPES, AGENT) if any(n.startswith(f"{t}_") for n in names)]
    return found or ["unknown"]


def load_datasets(
    script_args: TrainScriptArguments, kind: str, need_eval: bool, seed: int = 42
) -> tuple[Any, Any | None, dict[str, str], list[str]]:
    """(train, eval or None, {"<name>/<split>": fingerprint}, decision types): the chosen dataset
    folders mixed into one train and one eval set, shuffled, extra columns (meta) dropped."""
    from datasets import concatenate_datasets

    folders = dataset_folders(script_args.data, kind, script_args.decision_types)
    splits = [script_args.train_split] + ([script_args.eval_split] if need_eval else [])
    parts: dict[str, list[Any]] = {s: [] for s in splits}
    fingerprints: dict[str, str] = {}
    for name, folder in folders.items():
        dd = _load_dict(folder)
        for split in splits:
            if split not in dd:
                fix = ' or set eval_strategy: "no"' if split == script_args.eval_split else ""
                raise UserInputError(
                    f"dataset {folder} has no '{split}' split (it has: {', '.join(dd) or 'none'}); "
                    f"rebuild it with `rir build-data`{fix}"
                )
            ds = dd[split]
            _check_rows(name, folder, ds, kind)
            fingerprints[f"{name}/{split}"] = ds._fingerprint
            parts[split].append(ds.select_columns(list(COLUMNS[kind])))
    out = []
    for split, cap in (
        (script_args.train_split, script_args.max_train_samples),
        (script_args.eval_split, script_args.max_eval_samples),
    ):
        if split not in parts:
            out.append(None)
            continue
        ds = concatenate_datasets(parts[split]).shuffle(seed=seed, keep_in_memory=True)
        if cap is not None:
            ds = ds.select(range(min(cap, len(ds))), keep_in_memory=True)
        if len(ds) == 0:
            raise UserInputError(
                f"the '{split}' split of {', '.join(map(str, folders.values()))} is empty: "
                "generate more rollouts or use other decision_types"
            )
        out.append(ds.flatten_indices(keep_in_memory=True))
    return out[0], out[1], fingerprints, decision_types_of(list(folders))


def drop_overlong(ds: Any, tokenizer: Any, max_length: int | None, what: str) -> Any:
    """Drop rows whose prompt alone fills max_length: truncation would leave no completion tokens to
    learn from (and a batch of them gives a NaN loss). Says how many were dropped."""
    if ds is None or not max_length:
        return ds
    keep = [
        i
        for i, p in enumerate(ds["prompt"])
        if len(_ids(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True))) < max_length - 8
    ]
    if len(keep) < len(ds):
        logger.warning(
            "%s: dropped %d of %d rows whose prompt is >= max_length=%d tokens; raise max_length or "
            "rebuild the data with a smaller --max-prompt-tokens",
            what,
            len(ds) - len(keep),
            len(ds),
            max_length,
        )
        if not keep:
            raise UserInputError(f"every {what} prompt is longer than max_length={max_length} tokens: raise max_length")
        ds = ds.select(keep, keep_in_memory=True).flatten_indices(keep_in_memory=True)
    return ds


def _ids(encoded: Any) -> list[int]:
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded


# --- output: adapter card, resolved config -----------------------------------------------------
def versions() -> dict[str, str]:
    out = {}
    for dist in ("rir", "torch", "transformers", "trl", "peft", "datasets", "accelerate"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def write_card(
    output_dir: str,
    *,
    base_model: str,
    base_model_path: str,
    decision_types: list[str],
    fingerprints: dict[str, str],
    stage: str,
    extra: dict[str, Any] | None = None,
) -> Path:
    """`rir_controller.json`: what `rir_runtime.tuned` checks before serving the adapter."""
    from rir_runtime.prompts import PROMPT_FORMAT_VERSION

    card = {
        "kind": AGENT if decision_types == [AGENT] else "controller",
        "base_model": base_model,
        "base_model_path": base_model_path,
        "decision_types": decision_types,
        "prompt_format_version": PROMPT_FORMAT_VERSION,
        "dataset_fingerprints": fingerprints,
        "trained_with": versions(),
        "stage": stage,
        **(extra or {}),
    }
    path = Path(output_dir) / "rir_controller.json"
    path.write_text(json.dumps(card, indent=2) + "\n")
    return path


def write_resolved_config(output_dir: str, script_args: Any, training_args: Any, model_args: Any) -> None:
    """The fully resolved configuration next to the adapter (rerun or audit it later)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    resolved = {"script": asdict(script_args), "training": training_args.to_dict(), "model": asdict(model_args)}
    (Path(output_dir) / RESOLVED_CONFIG).write_text(json.dumps(resolved, indent=2, default=str) + "\n")


def last_checkpoint(training_args: Any) -> str | None:
    """The checkpoint to resume from: the one asked for, else the newest in output_dir (after a kill)."""
    from transformers.trainer_utils import get_last_checkpoint

    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    if os.path.isdir(training_args.output_dir):
        found = get_last_checkpoint(training_args.output_dir)
        if found:
            logger.warning("resuming from %s", found)
        return found
    return None


# --- out of memory ------------------------------------------------------------------------------
@contextlib.contextmanager
def oom_advice(training_args: Any) -> Iterator[None]:
    """Re-raise an out-of-memory crash as one error that says what to reduce."""
    import torch

    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err).lower():
            raise
        a = training_args
        effective = a.per_device_train_batch_size * a.gradient_accumulation_steps
        raise TrainingResourceError(
            f"out of memory while training (per_device_train_batch_size={a.per_device_train_batch_size}, "
            f"gradient_accumulation_steps={a.gradient_accumulation_steps}, max_length={a.max_length}, "
            f"gradient_checkpointing={a.gradient_checkpointing}). Reduce per_device_train_batch_size and raise "
            f"gradient_accumulation_steps to keep the effective batch of {effective}, lower max_length, and enable "
            "gradient_checkpointing; then rerun (training resumes from the last checkpoint)"
        ) from err
