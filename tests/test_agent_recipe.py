"""`rir train agent`: the recipe's rounds resolve, validate, cache and resume like pipeline stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.orchestration.config import build_config
from train import agent_recipe
from train.agent_recipe import AgentRecipeConfig, agents, data_settings, resolved_data, run_recipe

ROOT = Path(__file__).resolve().parents[1]
EXPERT = {"env": "builtin", "tasks": ["workshop-2"], "split": "train", "variations": "0-3"}


class Killed(Exception):
    """Stands for a kill."""


def write_data(tmp_path: Path, name: str, *extra: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"sources": [EXPERT, *extra], "detour_share": 0.0}))
    return str(path)


def recipe(tmp_path: Path, rounds: list[dict], **kw) -> AgentRecipeConfig:
    train_config = str(ROOT / "configs/train/agent_sft_cpu.yaml")
    values = {
        "out": str(tmp_path / "out"),
        "model": "tiny-random-llama",
        "train_config": train_config,
        "rounds": rounds,
    }
    values |= kw
    return build_config(AgentRecipeConfig, values)


# --- the recipe's config --------------------------------------------------------------------------
def test_previous_names_the_round_before_and_a_round_name_overrides_the_yaml(tmp_path: Path) -> None:
    expert = write_data(tmp_path, "expert")
    dagger = write_data(tmp_path, "dagger", {**EXPERT, "mistakes_of": "previous", "variations": "4-5"})
    fixed = write_data(tmp_path, "fixed", {**EXPERT, "mistakes_of": "llm:runs/agent-sft"})
    rounds = [
        {"name": "r1", "agent_data": expert, "max_steps": 1},
        {"name": "r2", "agent_data": dagger, "max_steps": 2, "start": "continue"},
        {"name": "r3", "agent_data": fixed, "max_steps": 3, "start": "continue"},
        {"name": "r4", "agent_data": fixed, "mistakes_of": "r1", "max_steps": 4, "start": "continue"},
    ]
    cfg = recipe(tmp_path, rounds)
    assert [agents(cfg, i) for i in range(4)] == [{}, {1: "r1"}, {}, {1: "r1"}]
    built = resolved_data(cfg, 1, tmp_path / "data")
    assert built.sources[1].mistakes_of == f"llm:{tmp_path / 'out' / 'r1' / 'adapter'}"
    assert built.sources[0].mistakes_of == "" and built.out == str(tmp_path / "data")
    assert resolved_data(cfg, 2, tmp_path).sources[1].mistakes_of == "llm:runs/agent-sft"  # a literal agent stays
    # the stage key names the round, not a path under `out`: a moved recipe folder keeps its cache
    moved = recipe(tmp_path, rounds, out=str(tmp_path / "elsewhere"))
    assert data_settings(cfg, 1) == data_settings(moved, 1)
    assert data_settings(cfg, 1)["sources"][1]["mistakes_of"] == "round r1"


@pytest.mark.parametrize(
    ("rounds", "error"),
    [
        ([{"name": "r1", "agent_data": "D", "max_steps": 2, "start": "continue"}], "is the first round"),
        (
            [{"name": "r1", "agent_data": "D", "max_steps": 2}, {"name": "r2", "data_of": "r1", "max_steps": 2}]
            + [{"name": "r3", "data_of": "r1", "max_steps": 2, "start": "continue"}],
            r"continues from step 2 of round 'r2': its max_steps \(2\) counts on from there and must be larger",
        ),
        ([{"name": "r1", "data_of": "r0", "max_steps": 2}], "data_of 'r0' is not an earlier round"),
        ([{"name": "r1", "agent_data": "P", "max_steps": 2}], "mistakes_of 'previous' names no earlier round"),
        ([{"name": "r1", "agent_data": "P", "mistakes_of": "r2", "max_steps": 2}], "mistakes_of 'r2' names no"),
        (
            [{"name": "r1", "agent_data": "D", "max_steps": 2}, {"name": "r2", "agent_data": "D", "max_steps": 2}]
            + [{"name": "r3", "agent_data": "D", "mistakes_of": "r1", "max_steps": 2}],
            "round 'r3': mistakes_of is set, but .* has no DAgger source",
        ),
        ([{"name": "r", "agent_data": "D", "max_steps": 2}, {"name": "r", "data_of": "r", "max_steps": 2}], "repeat"),
        ([{"name": "r1", "agent_data": "D", "data_of": "r0", "max_steps": 2}], "set agent_data .* or data_of"),
        ([{"name": "final", "agent_data": "D", "max_steps": 2}], "other than 'final'"),
        ([{"name": "r1", "agent_data": "D", "max_steps": 0}], "max_steps must be at least 1"),
        ([{"name": "r1", "agent_data": "D", "max_steps": 2, "start": "resume"}], "start 'resume' unknown"),
    ],
)
def test_recipe_errors_name_the_round_and_the_fix(tmp_path: Path, rounds: list[dict], error: str) -> None:
    paths = {"D": write_data(tmp_path, "d"), "P": write_data(tmp_path, "p", {**EXPERT, "mistakes_of": "previous"})}
    for r in rounds:
        r["agent_data"] = paths.get(r.get("agent_data", ""), r.get("agent_data", ""))
    with pytest.raises(UserInputError, match=error):
        recipe(tmp_path, rounds)


def test_train_args_may_not_set_what_the_recipe_sets_per_round(tmp_path: Path) -> None:
    rounds = [{"name": "r1", "agent_data": write_data(tmp_path, "d"), "max_steps": 1}]
    assert recipe(tmp_path, rounds, train_args=["--use_cpu", "false"]).train_args == ["--use_cpu", "false"]
    with pytest.raises(UserInputError, match=r"train_args \['--max_steps=3'\]: the recipe sets these"):
        recipe(tmp_path, rounds, train_args=["--max_steps=3"])


def test_previous_outside_a_recipe_is_refused_before_any_episode(tmp_path: Path) -> None:
    from data_gen.agent_data import AgentDataConfig, AgentDataSource, build_agent_data

    sources = [AgentDataSource(**EXPERT), AgentDataSource(**EXPERT, mistakes_of="previous")]
    cfg = AgentDataConfig(sources=sources, out=str(tmp_path))
    with pytest.raises(UserInputError, match="previous round of `rir train agent`; outside a recipe, name"):
        build_agent_data(cfg)
    assert not (Path(cfg.out) / "agent_sft").exists()


# --- the rounds as cached, resumable stages (training replaced by a stand-in) ----------------------
class FakeTraining:
    """Stands in for `python -m train.agent_sft`: records its flags, writes checkpoints up to max_steps
    (the trainer state last, as the Trainer does) and the adapter card; `die_at` kills it at that step."""

    def __init__(self, die_at: int | None = None) -> None:
        self.calls: list[dict[str, str]] = []
        self.heads: list[list[str]] = []
        self.die_at = die_at

    def __call__(self, what: str, cmd: list[str], label: str = "") -> None:
        self.heads.append(cmd[: cmd.index("train.agent_sft") + 1])
        args = cmd[cmd.index("train.agent_sft") + 1 :]
        flags = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
        self.calls.append(flags)
        out = Path(flags["--output_dir"])
        resume = flags.get("--resume_from_checkpoint")
        for step in range(int(resume.rsplit("-", 1)[1]) + 1 if resume else 1, int(flags["--max_steps"]) + 1):
            (out / f"checkpoint-{step}").mkdir(parents=True, exist_ok=True)
            if step == self.die_at:
                raise RIRError("killed")  # the checkpoint folder exists, its trainer state does not
            (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (out / "rir_controller.json").write_text(json.dumps({"kind": "agent", "steps": flags["--max_steps"]}))


def test_rounds_continue_resume_after_a_kill_and_are_cached(tmp_path: Path, monkeypatch, capsys) -> None:
    rounds = [
        {"name": "expert", "agent_data": write_data(tmp_path, "expert"), "max_steps": 1},
        {"name": "on", "data_of": "expert", "max_steps": 3, "start": "continue"},
    ]
    cfg = recipe(tmp_path, rounds)
    out = Path(cfg.out)
    killed = FakeTraining(die_at=3)
    monkeypatch.setattr(agent_recipe, "run_training", killed)
    with pytest.raises(RIRError, match="killed"):
        run_recipe(cfg)
    assert killed.calls[1]["--resume_from_checkpoint"] == str(out / "expert" / "adapter" / "checkpoint-1")
    assert killed.calls[1]["--data"] == str(out / "expert" / "data")

    again = FakeTraining()
    monkeypatch.setattr(agent_recipe, "run_training", again)
    capsys.readouterr()
    final = run_recipe(cfg)
    err = capsys.readouterr().err
    assert "[agent] expert: cached" in err and "[agent] on: resuming an unfinished run" in err
    (call,) = again.calls  # only the killed round, from its own last complete checkpoint
    assert call["--resume_from_checkpoint"] == str(out / "on" / "adapter" / "checkpoint-2")
    assert json.loads((final / "rir_controller.json").read_text())["steps"] == "3"
    assert json.loads((final / "recipe.json").read_text())["round_keys"].keys() == {"expert", "on"}
    assert not list(final.glob("checkpoint-*"))

    rounds[1]["max_steps"] = 4  # a changed round is redone, and says why
    run_recipe(recipe(tmp_path, rounds))
    assert "[agent] on: max_steps 3 -> 4: clearing" in capsys.readouterr().err
    assert again.calls[-1]["--resume_from_checkpoint"] == str(out / "expert" / "adapter" / "checkpoint-1")


def test_a_data_build_killed_while_saving_is_built_again(tmp_path: Path, monkeypatch) -> None:
    import data_gen.agent_data as agent_data_module

    rounds = [{"name": "expert", "agent_data": write_data(tmp_path, "expert"), "max_steps": 1}]
    real_build = agent_data_module.build_agent_data

    def killed_while_saving(cfg) -> None:  # what `datasets` leaves: the index written, no splits yet
        (Path(cfg.out) / "agent_sft").mkdir(parents=True)
        (Path(cfg.out) / "agent_sft" / "dataset_dict.json").write_text('{"splits": ["train", "validation"]}')
        raise Killed

    monkeypatch.setattr(agent_data_module, "build_agent_data", killed_while_saving)
    with pytest.raises(Killed):
        run_recipe(recipe(tmp_path, rounds))
    monkeypatch.setattr(agent_data_module, "build_agent_data", real_build)
    monkeypatch.setattr(agent_recipe, "run_training", FakeTraining())
    run_recipe(recipe(tmp_path, rounds))
    data = tmp_path / "out" / "expert" / "data" / "agent_sft"
    assert (data / "train").is_dir() and not (tmp_path / "out" / "expert" / "data.partial").exists()


def test_launcher_accelerate_launches_each_round_through_accelerate(tmp_path: Path, monkeypatch) -> None:
    rounds = [{"name": "expert", "agent_data": write_data(tmp_path, "expert"), "max_steps": 1}]
    accelerate = str(ROOT / "configs/accelerate/single_gpu.yaml")
    fake = FakeTraining()
    monkeypatch.setattr(agent_recipe, "run_training", fake)
    run_recipe(
        recipe(tmp_path, rounds, launcher="accelerate", accelerate_config=accelerate, train_args=["--bf16", "1"])
    )
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate, "-m", "train.agent_sft"]
    assert fake.heads == [launch] and fake.calls[0]["--bf16"] == "1"
    with pytest.raises(UserInputError, match="accelerate_config nope.yaml does not exist"):
        recipe(tmp_path, rounds, launcher="accelerate", accelerate_config="nope.yaml")


# --- the real thing on the tiny model ----------------------------------------------------------------
@pytest.mark.integration
def test_tiny_recipe_with_a_dagger_round_runs_end_to_end_and_then_is_cached(tmp_path: Path) -> None:
    """Two real rounds through `rir train agent`: cloning, then DAgger on the first round's own
    mistakes (`mistakes_of: previous`), continued from its checkpoint. The rerun trains nothing."""
    dagger = {"env": "builtin", "tasks": ["workshop-3"], "split": "train", "variations": "0-1"}
    dagger |= {"mistakes_of": "previous", "policy_mode": "rank"}
    config = {
        "out": str(tmp_path / "out"),
        "model": "tiny-random-llama",
        "train_args": ["--max_length", "4096", "--eval_strategy", "no", "--eval_on_start", "false"]
        + ["--save_steps", "1", "--per_device_train_batch_size", "2"],
        "rounds": [
            {"name": "expert", "agent_data": write_data(tmp_path, "expert"), "max_steps": 1},
            {"name": "dagger", "agent_data": write_data(tmp_path, "dagger", dagger), "max_steps": 2}
            | {"start": "continue"},
        ],
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "rir_runtime.cli", "train", "agent", "--config", str(tmp_path / "recipe.yaml")]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out"
    resolved = yaml.safe_load((out / "dagger" / "agent_data.yaml").read_text())
    assert resolved["sources"][1]["mistakes_of"] == f"llm:{out / 'expert' / 'adapter'}"
    state = json.loads((out / "dagger" / "adapter" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2  # continued: one step on top of the expert round's one
    assert json.loads((out / "final" / "rir_controller.json").read_text())["kind"] == "agent"

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/stage.json")}
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "[agent] expert: cached" in second.stderr and "[agent] dagger: cached" in second.stderr
    assert "train.agent_sft" not in second.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/stage.json")} == stamps
