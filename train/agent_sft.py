"""`rir train agent-sft`: behaviour-clone a base agent on expert trajectories (train splits only).

    rir train agent-sft --config configs/train/agent_sft_cpu.yaml
    rir train agent-sft --config configs/train/agent_sft_cpu.yaml --agent-data configs/build/agent_data.yaml
    rir eval --env textworld-cooking --tasks recipe1-prep --split dev --policy llm:runs/agent-sft --methods react

First builds the agent dataset (`data_gen/agent_data.py`, the LLM policy's own prompt renderer)
into `<data>/agent_sft` unless it is already there, then runs the controller's SFT machinery
(`train/sft.py`) with `decision_types: [agent]`, which writes an adapter card of kind `agent`:
the folder loads as a policy (`--policy llm:<folder>`) and is refused as a controller.
"""

from __future__ import annotations

import sys
from pathlib import Path

from data_gen.agent_data import AgentDataConfig, build_agent_data
from rir_runtime.errors import UserInputError, exit_code
from rir_runtime.orchestration.config import build_config, load_yaml

DEFAULT_AGENT_DATA = "configs/build/agent_data.yaml"


def split_agent_args(argv: list[str]) -> tuple[str, bool, list[str]]:
    """(agent-data YAML, rebuild?, the rest for the SFT parser)."""
    config, rebuild, rest = DEFAULT_AGENT_DATA, False, []
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key in ("--agent-data", "--agent_data"):
            config = value if eq else next(it, "")
        elif key == "--rebuild-data":
            rebuild = True
        else:
            rest.append(arg)
    return config, rebuild, rest


def main(argv: list[str]) -> int:
    from train.common.args import parse_train_args
    from train.common.distributed import main_process_first
    from train.sft import main as sft_main
    from train.sft import make_parser

    data_config, rebuild, rest = split_agent_args(argv)
    script_args, training_args, model_args = parse_train_args(make_parser(prog="rir train agent-sft"), rest)
    if script_args.decision_types != ["agent"]:
        script_args.decision_types = ["agent"]
    if not Path(data_config).is_file():
        raise UserInputError(f"agent data config {data_config} does not exist: pass --agent-data <yaml>")
    cfg = build_config(AgentDataConfig, {**load_yaml(data_config), "out": script_args.data}, source=data_config)
    with main_process_first(training_args, "building the agent dataset"):  # once, not in every process
        missing = not (Path(script_args.data) / "agent_sft" / "dataset_dict.json").is_file()
        if missing or (rebuild and training_args.process_index == 0):
            counts = build_agent_data(cfg)
            print(f"agent data: {counts} rows in {script_args.data}/agent_sft", file=sys.stderr)
    sft_main(script_args, training_args, model_args)
    return 0


if __name__ == "__main__":  # accelerate launch -m train.agent_sft --config ...
    sys.exit(exit_code(main, sys.argv[1:]))
