"""`rir train sft|dpo`: the training stages as subcommands of the `rir` CLI.

    rir train sft --config configs/train/sft_cpu_quick.yaml --data /tmp/traindata --max-steps 20
    rir train dpo --config configs/train/dpo_cpu_quick.yaml --sft-adapter runs/sft-cpu-quick
    rir train grpo --config configs/train/grpo_cpu_quick.yaml --sft-adapter runs/sft-cpu-quick
    rir train sft --launcher accelerate --accelerate-config configs/accelerate/multi_gpu.yaml \
        --config configs/train/sft_qwen2.5-0.5b.yaml
    rir train sft --launcher accelerate --num_processes 2 --cpu --config configs/train/sft_cpu_quick.yaml
    rir train sft --help        # every key: ours, TRL's SFTConfig and ModelConfig
    rir train calibrate --adapter runs/controller-cpu/dpo --data runs/controller-cpu/data

Everything after the stage goes to the stage's `TrlParser` (the same keys as the YAML; flags
override it). `--launcher accelerate` relaunches `python -m train.<stage>` through `accelerate
launch --config_file <accelerate-config>`; accelerate's own flags (`--num_processes`,
`--mixed_precision`, `--main_process_port`, ...: `accelerate launch --help`) go to it. Without
--num_processes a config takes one process per GPU; more than one picks multi_gpu.yaml by default.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.launch import check_launcher

STAGES = {
    "sft": "supervised fine-tuning of a controller LoRA adapter on the *_sft datasets",
    "dpo": "preference tuning (DPO) of a controller adapter on the *_pref datasets, from an SFT adapter",
    "grpo": "reinforcement learning (GRPO) of a controller adapter on review and locate prompts, rewarded by "
    "each row's hindsight value table; from an SFT adapter or the base model",
    "value": "the value controller: a scalar head with a LoRA adapter ranking a decision's options (continue, "
    "recover to checkpoint i with its lesson) by their hindsight values (TRL RewardTrainer) on value_pref",
    "agent-sft": ("behaviour-clone the base agent on expert trajectories (train splits); loads as --policy llm:<dir>"),
    "agent": "the cloned agent in one command: rounds of agent data and agent-sft from a recipe YAML "
    "(configs/pipeline/agent_cpu.yaml), cached and resumable",
    "calibrate": "fit a trained adapter's recover/continue threshold again, on a dataset's calibration split "
    "(training does it once; this refits it, e.g. on other data), into the adapter card",
}


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    """Add `train <stage>` to the `rir` parser, one subcommand per stage (handlers return an exit code)."""
    train = sub.add_parser(
        name,
        help=help_text,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    stages = train.add_subparsers(dest="train_stage", required=True, metavar="STAGE")
    for stage, help_text in STAGES.items():
        # prefix_chars="+": every dashed argument (also -h) is left to the stage's TrlParser.
        p = stages.add_parser(stage, help=help_text, add_help=False, prefix_chars="+")
        p.add_argument("argv", nargs=argparse.REMAINDER)
        p.set_defaults(handler=cmd_train, train_stage=stage)


def split_launcher(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """(launcher, accelerate config or None, the rest) from `--launcher X --accelerate-config Y ...`."""
    launcher, acc_config, rest = "python", None, []
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key in ("--launcher", "--accelerate-config", "--accelerate_config"):
            value = value if eq else next(it, "")
            if key == "--launcher":
                check_launcher(value, "--launcher")
                launcher = value
            else:
                acc_config = value
        else:
            rest.append(arg)
    return launcher, acc_config, rest


def cmd_train(args: argparse.Namespace) -> int:
    stage = args.train_stage
    if stage == "calibrate":
        return cmd_calibrate(list(args.argv))
    if stage == "agent":  # a recipe of agent-sft rounds; its YAML names the launcher
        from train.agent_recipe import main as recipe_main

        return recipe_main(list(args.argv))
    launcher, acc_config, argv = split_launcher(list(args.argv))
    if launcher == "accelerate":
        from rir_runtime.orchestration.launch import accelerate_command

        cmd = accelerate_command(f"train.{stage.replace('-', '_')}", argv, acc_config)  # agent-sft: agent_sft.py
        print("launching:", shlex.join(cmd), file=sys.stderr)
        return subprocess.call(cmd)
    from train.common.args import parse_train_args

    if stage == "agent-sft":
        from train.agent_sft import main as agent_main

        return agent_main(argv)
    prog = f"rir train {stage}"
    if stage == "sft":
        from train import sft

        sft.main(*parse_train_args(sft.make_parser(prog=prog), argv))
    elif stage == "grpo":
        from train import grpo

        grpo.main(*parse_train_args(grpo.make_parser(prog=prog), argv))
    elif stage == "value":
        from train import value

        value.main(*parse_train_args(value.make_parser(prog=prog), argv))
    else:
        from train import dpo

        dpo.main(*parse_train_args(dpo.make_parser(prog=prog), argv))
    return 0


def cmd_calibrate(argv: list[str]) -> int:
    """`rir train calibrate --adapter DIR --data DIR`: the review threshold that training writes into
    the adapter card, fitted again (the adapter's weights are not touched)."""
    from rir_runtime.llm.card import CARD, has_card, read_card
    from train.common.calibrate import MIN_ROWS_PER_LABEL, calibrate_review

    parser = argparse.ArgumentParser(prog="rir train calibrate", description=cmd_calibrate.__doc__)
    parser.add_argument("--adapter", required=True, help="adapter folder of `rir train sft|dpo|grpo`")
    parser.add_argument("--data", required=True, help="dataset folder of `rir build-data` (holds review_sft)")
    parser.add_argument("--rows", type=int, default=120, help="review rows scored at most (default: 120)")
    parser.add_argument(
        "--min-per-label", type=int, default=MIN_ROWS_PER_LABEL, help="fewer rows of a label: threshold 0"
    )
    args = parser.parse_args(argv)
    read_card(args.adapter)  # a controller adapter in this runtime's prompt format, or a clear error
    if not has_card(args.adapter):
        raise UserInputError(
            f"{args.adapter} is a plain PEFT adapter without {CARD}, where the threshold is written: "
            "calibrate an adapter trained by `rir train sft|dpo|grpo`"
        )
    record = calibrate_review(args.adapter, args.data, max_rows=args.rows, min_per_label=args.min_per_label)
    print(f"review_threshold {record['review_threshold']:+.3f} written to {Path(args.adapter) / CARD}")
    return 0
