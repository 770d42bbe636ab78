"""The small cloned agent shipped in git (`agents/smollm2-135m-small`): complete, under the 5 MB
limit, made by the recipe it names, and current with the agent prompt it was trained on."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from rir_runtime.llm.card import read_card
from rir_runtime.orchestration.config import build_config, load_yaml
from rir_runtime.prompts import prompt_format_version
from train.agent_recipe import AgentRecipeConfig

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "agents" / "smollm2-135m-small"
RECIPE = ROOT / "configs" / "pipeline" / "agent_small_cpu.yaml"
FILES = {"adapter_model.safetensors", "adapter_config.json", "rir_controller.json", "recipe.json", "README.md"}


def test_the_shipped_agent_is_complete_and_under_five_megabytes() -> None:
    sizes = {p.name: p.stat().st_size for p in AGENT.iterdir()}
    assert FILES <= set(sizes), f"missing: {FILES - set(sizes)}"
    assert sum(sizes.values()) <= 5_000_000, sizes


def test_the_shipped_agent_matches_its_recipe_and_todays_agent_prompt() -> None:
    """A change to the agent prompt (its format version) or to the recipe makes this adapter stale:
    rerun the recipe and copy its final/ here (agents/README.md)."""
    card = read_card(AGENT, expect="agent")  # also checks the kind
    assert card["base_model"] == "smollm2-135m-instruct" and card["base_model_source"] == "registry"
    assert card["prompt_format_version"] == prompt_format_version("agent")
    recipe = build_config(AgentRecipeConfig, load_yaml(RECIPE), source=str(RECIPE))
    made_by = json.loads((AGENT / "recipe.json").read_text())["config"]
    for key in ("model", "train_config", "train_args", "rounds"):
        assert made_by[key] == asdict(recipe)[key], key
    lora = json.loads((AGENT / "adapter_config.json").read_text())
    rank = recipe.train_args[recipe.train_args.index("--lora_r") + 1]
    assert lora["r"] == int(rank) and lora["peft_type"] == "LORA"


@pytest.mark.integration
def test_the_shipped_agent_loads_on_the_packaged_model_and_plays(tmp_path: Path) -> None:
    """Served through `llm:<folder>` like any agent adapter (the tokenizer is the base model's, as
    the folder ships none), it wins TextWorld's first dev game through `rir eval`."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "rir_runtime.cli", "eval", "--env", "textworld-cooking", "--tasks", "recipe1"]
    cmd += ["--split", "dev", "--variations", "0", "--methods", "react", "--policy", f"llm:{AGENT}"]
    cmd += ["--policy_mode", "rank", "--budget_agent", "12", "--workers", "1", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    react = json.loads((out / "summary.json").read_text())["methods"]["react"]
    # it wins this game in 3 calls (greedy ranking is deterministic): a broken load or a stale
    # adapter would not
    assert react["episodes"] == 1 and react["parse_failures"] == 0 and react["success_rate"] == 1.0
