"""`rir train agent`: the cloned agent in one command, as a recipe of training rounds.

    rir train agent --config configs/pipeline/agent_cpu.yaml      # then: --policy llm:runs/agent-v7/final
    rir train agent --config configs/pipeline/agent_gpu.yaml      # the same rounds under accelerate, one GPU
    rir train agent --help                                        # every key (YAML keys; flags override)

Each round builds its agent data (`data_gen/agent_data.py`) and trains an agent adapter through
the existing entry point (`python -m train.agent_sft`, or `accelerate launch ... -m train.agent_sft`),
either fresh on the base model or on from the previous round's last checkpoint (`max_steps` then
counts on from that checkpoint's step, as `--resume_from_checkpoint` does by hand).
A DAgger source records the mistakes of an earlier round's adapter: `mistakes_of: previous` in the
agent-data YAML, or the round's own `mistakes_of` (`previous` or an earlier round's name), which
replaces the agent of every DAgger source of its YAML (so the shipped YAMLs serve both the recipe
and the hand-typed commands).

Rounds are stages of the pipeline's cache (`rir_runtime.orchestration.stages.Stages`): a rerun skips finished rounds,
resumes a killed round from its newest checkpoint, and redoes a round whose settings or earlier
rounds changed, after saying what changed. Layout: `<out>/<round>/` holds `agent_data.yaml` (the
resolved data config), `data/agent_sft` and `adapter/` (with its checkpoints); `<out>/final` is a
copy of the last round's adapter with its card and `recipe.json`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from data_gen.agent_data import PREVIOUS, AgentDataConfig
from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.llm.card import CARD, has_card
from rir_runtime.orchestration.config import FlagParser, add_dataclass_arguments, build_config, load_yaml, parse_config
from rir_runtime.orchestration.launch import (
    LAUNCHERS,
    SINGLE_PROCESS_CONFIG,
    check_launcher,
    last_complete_checkpoint,
    run_training,
    train_command,
)
from rir_runtime.orchestration.stages import Stages, yaml_settings

STARTS = ("fresh", "continue")
# Flags the recipe sets for each round; `train_args` may not override them.
MANAGED: tuple[str, ...] = ("config", "model", "agent-data", "agent_data", "data", "output_dir", "output-dir")
MANAGED += ("max_steps", "max-steps", "resume_from_checkpoint", "resume-from-checkpoint")


# --- the recipe ---------------------------------------------------------------------------------
@dataclass
class AgentRound:
    """One training round: its data, how far it trains, and what it starts from."""

    name: str = field(default="", metadata={"help": "the round's folder under out"})
    agent_data: str = field(default="", metadata={"help": "agent-data YAML this round builds and trains on"})
    data_of: str = field(default="", metadata={"help": "instead of agent_data: train on this earlier round's data"})
    mistakes_of: str = field(
        default="",
        metadata={
            "help": "whose mistakes the YAML's DAgger sources record: previous, or an earlier round's name "
            "(empty: as the YAML says)"
        },
    )
    max_steps: int = field(default=0, metadata={"help": "train to this global step (continue: counted on)"})
    start: str = field(
        default="fresh",
        metadata={
            "help": "fresh: a new adapter on the base model; continue: on from the previous round's last checkpoint",
            "choices": list(STARTS),
        },
    )

    def __post_init__(self) -> None:
        if not self.name or self.name == "final" or Path(self.name).name != self.name or self.name.startswith("."):
            raise UserInputError(f"round name '{self.name}' must be a plain folder name other than 'final'")
        if bool(self.agent_data) == bool(self.data_of):
            raise UserInputError(f"round '{self.name}': set agent_data (a YAML) or data_of (an earlier round), one")
        if self.data_of and self.mistakes_of:
            raise UserInputError(f"round '{self.name}': mistakes_of applies to agent_data, not to data_of")
        if self.max_steps < 1:
            raise UserInputError(f"round '{self.name}': max_steps must be at least 1, not {self.max_steps}")
        if self.start not in STARTS:
            raise UserInputError(f"round '{self.name}': start '{self.start}' unknown: choose {' or '.join(STARTS)}")


@dataclass
class AgentRecipeConfig:
    """The rounds that make the cloned agent, and how each round's training is launched."""

    out: str = field(default="runs/agent", metadata={"help": "recipe folder: one folder per round, and final/"})
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "base model of every round"})
    train_config: str = field(
        default="configs/train/agent_sft_cpu.yaml", metadata={"help": "agent SFT YAML (configs/train/agent_sft_*)"}
    )
    train_args: list[str] = field(
        default_factory=list,
        metadata={"help": "extra flags of every round's training, e.g. --train-args=--use_cpu,false,--bf16,true"},
    )
    launcher: str = field(default="python", metadata={"help": "how training runs", "choices": list(LAUNCHERS)})
    accelerate_config: str = field(
        default=SINGLE_PROCESS_CONFIG, metadata={"help": "accelerate config of launcher accelerate"}
    )
    rounds: list[AgentRound] = field(default_factory=list, metadata={"help": "the rounds, in order (YAML list)"})

    def __post_init__(self) -> None:
        if not self.rounds:
            raise UserInputError("rounds is empty: list at least one round")
        check_launcher(self.launcher)
        if self.launcher == "accelerate" and not Path(self.accelerate_config).is_file():
            raise UserInputError(
                f"accelerate_config {self.accelerate_config} does not exist: name one of "
                "configs/accelerate/<single_gpu|multi_gpu|fsdp|deepspeed_zero2>.yaml"
            )
        names = [r.name for r in self.rounds]
        if len(set(names)) < len(names):
            raise UserInputError(f"round names {names} repeat: give each round its own name (its folder)")
        managed = [a for a in self.train_args if a.startswith("--") and a[2:].split("=")[0] in MANAGED]
        if managed:
            raise UserInputError(f"train_args {managed}: the recipe sets these for each round; use the round's keys")
        for index in range(len(self.rounds)):
            check_round(self, index)


def check_round(cfg: AgentRecipeConfig, index: int) -> None:
    """What a round names must exist before it: its data round, its DAgger agents, the round it continues."""
    r, earlier = cfg.rounds[index], cfg.rounds[:index]
    if r.data_of and r.data_of not in [e.name for e in earlier if e.agent_data]:
        raise UserInputError(
            f"round '{r.name}': data_of '{r.data_of}' is not an earlier round with agent_data "
            f"({', '.join(e.name for e in earlier if e.agent_data) or 'none'})"
        )
    if r.start == "continue":
        if not earlier:
            raise UserInputError(f"round '{r.name}' is the first round: it can only start fresh")
        if r.max_steps <= earlier[-1].max_steps:
            raise UserInputError(
                f"round '{r.name}' continues from step {earlier[-1].max_steps} of round '{earlier[-1].name}': "
                f"its max_steps ({r.max_steps}) counts on from there and must be larger"
            )
    if r.mistakes_of:
        _earlier_round(cfg, index, r.mistakes_of)
        if not any(s.mistakes_of for s in agent_data(cfg, index).sources):
            raise UserInputError(
                f"round '{r.name}': mistakes_of is set, but {r.agent_data} has no DAgger source (one with "
                "mistakes_of) to apply it to"
            )
    if r.agent_data:
        agents(cfg, index)  # resolves every DAgger agent, or says which one it cannot


# --- a round's data ----------------------------------------------------------------------------
def _earlier_round(cfg: AgentRecipeConfig, index: int, ref: str) -> str:
    """The round that `ref` (previous, or a round's name) names, as seen from round `index`."""
    names = [r.name for r in cfg.rounds[:index]]
    if ref == PREVIOUS and names:
        return names[-1]
    if ref in names:
        return ref
    raise UserInputError(
        f"round '{cfg.rounds[index].name}': mistakes_of '{ref}' names no earlier round "
        f"(earlier rounds: {', '.join(names) or 'none'}; '{PREVIOUS}' is the one just before)"
    )


def agent_data(cfg: AgentRecipeConfig, index: int) -> AgentDataConfig:
    """The round's agent-data YAML, as written (its DAgger agents not yet resolved)."""
    path = cfg.rounds[index].agent_data
    if not Path(path).is_file():
        raise UserInputError(f"round '{cfg.rounds[index].name}': agent_data {path} does not exist")
    return build_config(AgentDataConfig, load_yaml(path), source=path)


def agents(cfg: AgentRecipeConfig, index: int) -> dict[int, str]:
    """{source index: the earlier round whose adapter it asks} for the round's DAgger sources."""
    r = cfg.rounds[index]
    found = {}
    for i, source in enumerate(agent_data(cfg, index).sources):
        if source.mistakes_of and (r.mistakes_of or source.mistakes_of == PREVIOUS):
            found[i] = _earlier_round(cfg, index, r.mistakes_of or source.mistakes_of)
    return found


def adapter_dir(cfg: AgentRecipeConfig, name: str) -> Path:
    return Path(cfg.out) / name / "adapter"


def data_settings(cfg: AgentRecipeConfig, index: int) -> dict[str, Any]:
    """The round's data config for its stage key: a DAgger agent that is a round is named by the round
    (its adapter's contents are in the key through that round's key), not by a path under `out`."""
    settings = asdict(agent_data(cfg, index))
    settings.pop("out")
    for i, name in agents(cfg, index).items():
        settings["sources"][i]["mistakes_of"] = f"round {name}"
    return settings


def resolved_data(cfg: AgentRecipeConfig, index: int, out: Path) -> AgentDataConfig:
    """The round's data config as built: each round-named DAgger agent is that round's adapter."""
    data = agent_data(cfg, index)
    named = agents(cfg, index)
    sources = [
        replace(s, mistakes_of=f"llm:{adapter_dir(cfg, named[i])}") if i in named else s
        for i, s in enumerate(data.sources)
    ]
    return replace(data, sources=sources, out=str(out))


def build_round_data(cfg: AgentRecipeConfig, index: int, folder: Path) -> None:
    """`<round>/agent_data.yaml` and `<round>/data/agent_sft`, unless a finished build is there. The
    data is built aside and then renamed: `datasets` writes dataset_dict.json before the splits, so a
    build killed while saving would otherwise look finished."""
    from data_gen.agent_data import build_agent_data

    data = resolved_data(cfg, index, folder / "data")
    (folder / "agent_data.yaml").write_text(yaml.safe_dump(asdict(data), sort_keys=False))
    if (folder / "data").is_dir():
        return
    partial = folder / "data.partial"
    shutil.rmtree(partial, ignore_errors=True)
    counts = build_agent_data(replace(data, out=str(partial)))
    partial.rename(folder / "data")
    print(f"[agent] {cfg.rounds[index].name}: agent data {counts} rows", file=sys.stderr)


# --- a round's training ---------------------------------------------------------------------------
def round_flags(cfg: AgentRecipeConfig, index: int, folder: Path) -> list[str]:
    """The flags of `train.agent_sft` for a round. It resumes from its own newest checkpoint (after a
    kill); a continued round without one starts from the previous round's last checkpoint."""
    r = cfg.rounds[index]
    data_folder = Path(cfg.out) / r.data_of if r.data_of else folder
    args = ["--config", cfg.train_config, "--model", cfg.model, "--agent-data", str(data_folder / "agent_data.yaml")]
    args += ["--data", str(data_folder / "data"), "--output_dir", str(folder / "adapter")]
    args += ["--max_steps", str(r.max_steps)]
    start = last_complete_checkpoint(folder / "adapter")
    if start is not None:
        print(f"[agent] {r.name}: resuming training from {start}", file=sys.stderr)
    elif r.start == "continue":
        previous = cfg.rounds[index - 1].name
        start = last_complete_checkpoint(adapter_dir(cfg, previous))
        if start is None:
            raise RIRError(
                f"round '{r.name}' continues from round '{previous}', which saved no checkpoint in "
                f"{adapter_dir(cfg, previous)}: keep save_strategy: steps in {cfg.train_config}"
            )
    return args + (["--resume_from_checkpoint", str(start)] if start else []) + cfg.train_args


def round_stage(stages: Stages, cfg: AgentRecipeConfig, index: int) -> Path:
    """One round as a stage: its key covers its settings and the rounds it reads."""
    r = cfg.rounds[index]
    settings = {
        "model": cfg.model,
        "train_config": yaml_settings(cfg.train_config, "train_config"),
        "train_args": cfg.train_args,
        "agent_data": data_settings(cfg, index) if r.agent_data else None,
        "data_of": r.data_of,
        "max_steps": r.max_steps,
        "start": r.start,
    }  # not the launcher: how a round runs does not change what it trains
    inputs = list(agents(cfg, index).values()) if r.agent_data else [r.data_of]
    inputs += [cfg.rounds[index - 1].name] if r.start == "continue" else []

    def fn(folder: Path) -> None:
        if r.agent_data:
            build_round_data(cfg, index, folder)
        cmd = train_command("train.agent_sft", round_flags(cfg, index, folder), cfg.launcher, cfg.accelerate_config)
        run_training(f"round '{r.name}'", cmd, label="agent")

    return stages.run(r.name, settings, fn, inputs=list(dict.fromkeys(inputs)))


# --- the whole recipe ---------------------------------------------------------------------------------
def run_recipe(cfg: AgentRecipeConfig) -> Path:
    """Every round in order (cached), then `<out>/final`: the last adapter, its card and the recipe."""
    stages = Stages(Path(cfg.out), label="agent")
    folders = [round_stage(stages, cfg, i) for i in range(len(cfg.rounds))]
    adapter = folders[-1] / "adapter"
    if not has_card(adapter):
        raise RIRError(f"{adapter} has no adapter card ({CARD}): its training did not finish")
    final = Path(cfg.out) / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(adapter, final, ignore=shutil.ignore_patterns("checkpoint-*"))
    recipe = {"config": asdict(cfg), "round_keys": stages.keys, "timings_s": stages.timings}
    (final / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    print(f"[agent] done: {final} (use it as --policy llm:{final})", file=sys.stderr)
    return final


def make_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="rir train agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="recipe YAML (configs/pipeline/agent_*.yaml); flags override it")
    add_dataclass_arguments(parser, AgentRecipeConfig)
    return parser


def main(argv: list[str]) -> int:
    run_recipe(parse_config(AgentRecipeConfig, make_parser().parse_args(argv)))
    return 0
