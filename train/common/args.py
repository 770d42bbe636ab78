"""The script arguments of `rir train sft|dpo|agent-sft` and their parsing.

The arguments are the `data` / `decision_types` / `model` half of a train config; the rest is TRL's
`SFTConfig`/`DPOConfig` and `ModelConfig`. Parsing is `TrlParser.parse_args_and_config` plus an
unknown-key check that names the nearest valid key (HfArgumentParser would take a misspelt YAML key
as a silent no-op), and `run_script` turns our errors into one line and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rir_runtime.errors import UserInputError, exit_code
from rir_runtime.llm.card import VALUE_HEADS
from train.common.calibrate import MIN_ROWS_PER_LABEL

DECISION_TYPES = ("review", "locate", "reflect")
AGENT = "agent"  # the behaviour-cloned base policy (`rir train agent-sft`): its own adapter kind


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
    decision_shares: list[float] | None = field(
        default=None,
        metadata={
            "help": "share of the train rows for each of decision_types, in order (e.g. 0.6 0.3 0.1): each "
            "decision's rows are resampled to its share of the total, which stays the same; default: "
            "the mix the data has; moot (dropped) when one decision type is trained"
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
    calibrate_review: bool = field(
        default=True,
        metadata={
            "help": "after training, calibrate the recover/continue threshold on the data's calibration split "
            "(data built without one: the eval split's review rows)"
        },
    )
    calibration_rows: int = field(default=200, metadata={"help": "review rows scored for the calibration"})
    calibration_min_per_label: int = field(
        default=MIN_ROWS_PER_LABEL,
        metadata={"help": "fewer calibration rows than this of either label: no threshold is fitted (it stays 0)"},
    )
    balance_review: bool = field(
        default=True,
        metadata={"help": "resample the train split's review rows so that both labels are equally frequent"},
    )
    balance_locate: bool = field(
        default=True,
        metadata={
            "help": "resample the train split's restore-point rows so that answers that stay at the current "
            "checkpoint are as frequent as those that step back"
        },
    )
    balance_sources: bool = field(
        default=False,
        metadata={
            "help": "with balance_review / balance_locate: within each answer class, give every rollout folder "
            "(meta.source_run) an equal share, so a small folder (the agent's own rollouts) is not drowned; "
            "for the value controller: its max_train_samples pairs shared equally by the rollout folders"
        },
    )

    lora_top_layers: int | None = field(
        default=None,
        metadata={
            "help": "LoRA on the top N decoder layers only (PEFT layers_to_transform): the backward pass stops "
            "there, so a step costs less; default: every layer"
        },
    )
    balance_pairs: bool = field(
        default=False,
        metadata={
            "help": "value controller: train on equal shares of its three contrasts (a recovery beats going on; "
            "going on beats the latest recovery; one checkpoint beats another), where the build's pairs are "
            "mostly going on against distant checkpoints (off: at 40 CPU steps it ranked reviews no better, "
            "docs/results.md)"
        },
    )

    value_head: str = field(
        default="scalar",
        metadata={
            "help": "value controller: 'scalar' (a scalar head ranking option pairs, TRL RewardTrainer) or 'lm' "
            "(the language model's own head, fine-tuned with TRL SFTTrainer to name each decision's best option; "
            "an option scores its log-probability)"
        },
    )

    def __post_init__(self) -> None:
        if self.value_head not in VALUE_HEADS:
            raise UserInputError(f"value_head {self.value_head!r} invalid: choose one of {', '.join(VALUE_HEADS)}")
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
        if self.decision_shares is not None and len(self.decision_types) == 1:
            # one decision takes every row: a config's mix must not block `--decision_types review`
            self.decision_shares = None
        if self.decision_shares is not None:
            shares = [float(x) for x in self.decision_shares]
            if len(shares) != len(self.decision_types) or any(x < 0 for x in shares) or sum(shares) <= 0:
                raise UserInputError(
                    f"decision_shares {shares} invalid: give one non-negative share per decision type "
                    f"({', '.join(self.decision_types)}), in that order, with a positive sum"
                )
            self.decision_shares = [x / sum(shares) for x in shares]

    def calibrates(self, decision_types: Sequence[str]) -> bool:
        """Whether training ends by calibrating the review threshold: it trained the review decision and
        `calibrate_review` is on."""
        return self.calibrate_review and "review" in decision_types


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
    from rir_runtime.orchestration.config import load_yaml

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
    """`python -m train.sft|dpo|grpo|value`: parse, train; our errors become one line and exit code 2
    (`exit_code`, as for every entry point)."""

    def train() -> None:
        main(*parse_train_args(parser, argv))

    return exit_code(train)
