"""Every shipped stage config parses; the quickstart pipeline runs end to end on the tiny model and
its stage cache skips what is done, re-runs what changed and resumes a run killed midway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from data_gen.agent_data import AgentDataConfig
from data_gen.build_config import BuildConfig
from data_gen.rollout import RolloutConfig
from eval.harness import EvalConfig
from eval.pipeline import PipelineConfig, Suite, run_pipeline, suite_label_values
from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.config import build_config, load_yaml
from rir_runtime.orchestration.launch import last_complete_checkpoint
from train.agent_recipe import AgentRecipeConfig

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"eval": EvalConfig, "rollout": RolloutConfig, "build": BuildConfig, "pipeline": PipelineConfig}


@pytest.mark.parametrize(
    "path",
    sorted(p for kind in KINDS for p in (ROOT / "configs" / kind).glob("*.yaml")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_shipped_configs_parse(path: Path) -> None:
    agent_data = path.parent.name == "build" and path.name.startswith("agent_data")
    agent_recipe = path.parent.name == "pipeline" and path.name.startswith("agent_")  # `rir train agent`
    kind = AgentDataConfig if agent_data else AgentRecipeConfig if agent_recipe else KINDS[path.parent.name]
    try:
        config = build_config(kind, load_yaml(path), source=str(path))
    except UserInputError as err:  # a tuned adapter that the commands in the file's header write first
        if "adapter folder" in str(err) and "does not exist" in str(err):
            pytest.skip(f"{path.name} needs an adapter trained first: {err}")
        raise
    assert config is not None


def test_eval_config_rejects_bad_names_and_empty_sweeps() -> None:
    with pytest.raises(UserInputError, match="unknown controller 'promptd:x'"):
        build_config(EvalConfig, {"controller": ["promptd:x"]})
    with pytest.raises(UserInputError, match="budget_sweep has no points"):
        build_config(EvalConfig, {"budget_sweep": []})
    with pytest.raises(UserInputError, match="unknown method 'reflection'.*Did you mean 'reflexion'"):
        build_config(EvalConfig, {"methods": ["reflection"]})


def test_a_suite_may_label_its_rollouts_with_its_own_value() -> None:
    """The agent's own rollouts may be valued with the lesson kept while the rest keep the expert's."""
    suites = [Suite("builtin", ["workshop-3"]), Suite("textworld-cooking", ["recipe1"], name="tw-agent")]
    suites[1].label_value = "agent-lesson"
    cfg = PipelineConfig(suites=suites)
    rollouts = [Path(f"runs/x/rollout-{s.label}") for s in cfg.suites]
    assert [(p.name, v) for p, v in suite_label_values(cfg, rollouts)] == [("rollout-tw-agent", "agent-lesson")]
    assert cfg.label_value == "expert"
    suites[1].label_value = "agent-memory"
    with pytest.raises(ValueError, match=r"suites \['tw-agent'\] set a label_value that is not one of"):
        PipelineConfig(suites=suites)


def test_a_suite_may_set_the_rollback_budget_of_its_rollouts_and_evaluation() -> None:
    """The quickstart's workshop rollouts run in the evaluation's budgets, so the Where learns the
    decisions it is served; a suite that sets none keeps the rollout default (several recoveries)."""
    from eval.pipeline import eval_stage, rollout_stage

    class Recorder:
        def run(self, name: str, settings: dict[str, object], build: object, inputs: object = None) -> Path:
            self.settings = settings
            return Path(name)

    stages = Recorder()
    own = Suite("builtin", ["workshop-3"], budget_agent="40", budget_rollback=1)
    cfg = PipelineConfig(suites=[own], budget_rollback=3)
    rollout_stage(stages, cfg, own)  # type: ignore[arg-type]
    assert (stages.settings["budget_agent"], stages.settings["budget_rollback"]) == ("40", 1)
    eval_stage(stages, cfg, own, [], ["heuristic"])  # type: ignore[arg-type]
    assert stages.settings["budget_rollback"] == 1
    plain = Suite("builtin", ["workshop-3"])
    rollout_stage(stages, cfg, plain)  # type: ignore[arg-type]
    assert stages.settings["budget_rollback"] == 5  # the rollout default
    eval_stage(stages, cfg, plain, [], ["heuristic"])  # type: ignore[arg-type]
    assert stages.settings["budget_rollback"] == 3  # the pipeline's


def test_train_seed_reaches_both_trainings_and_keys_their_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--train_seed N` (to measure run-to-run spread) is passed to SFT and DPO and redoes both stages;
    0 keeps the configs' seeds and the stage keys of earlier builds."""
    import eval.pipeline as pipeline
    from rir_runtime.orchestration.stages import Stages

    commands: list[list[str]] = []
    monkeypatch.setattr(pipeline, "run_training", lambda _what, command: commands.append(command))
    cfg = PipelineConfig(
        suites=[Suite("builtin", ["workshop-3"], "0-5")], dpo_config="configs/train/dpo_controller_cpu.yaml"
    )

    def train(cfg: PipelineConfig) -> tuple[str, str]:
        stages = Stages(tmp_path)
        data = stages.run("data", {}, lambda d: None)
        sft = pipeline.sft_stage(stages, cfg, data)
        pipeline.dpo_stage(stages, cfg, data, sft)
        return stages.keys["sft"], stages.keys["dpo"]

    kept = train(cfg)
    assert len(commands) == 2 and not any("--seed" in c for c in commands)
    seeded = train(replace(cfg, train_seed=7))
    assert all(c[c.index("--seed") + 1] == "7" for c in commands[2:]) and len(commands) == 4
    assert seeded[0] != kept[0] and seeded[1] != kept[1]


def tiny_quickstart(out: Path) -> PipelineConfig:
    """configs/pipeline/quickstart.yaml with the tiny random model and a few episodes."""
    cfg = build_config(PipelineConfig, load_yaml(ROOT / "configs/pipeline/quickstart.yaml"))
    # the tiny model's byte-level tokenizer makes prompts ~4x longer in tokens than SmolLM2's
    return replace(
        cfg,
        out=str(out),
        base_model="tiny-random-llama",
        sft_max_steps=2,
        sft_max_length=4096,
        value_max_train_steps=2,
        controller_eval_rows=2,
        suites=[Suite("builtin", ["workshop-3"], "0-5", "0-1")],
        explore=["random-review"],
        budget_agent=16,
    )


@pytest.mark.integration
def test_quickstart_pipeline_runs_and_caches(tmp_path: Path) -> None:
    cfg = tiny_quickstart(tmp_path)
    report = run_pipeline(cfg)
    text = report.read_text()
    assert text.startswith("# RIR pipeline report")
    assert "**Winner:" in text.splitlines()[2] or "**No significant difference**" in text.splitlines()[2]
    assert (tmp_path / "sft" / "rir_controller.json").exists()
    summary = json.loads((tmp_path / "eval-builtin" / "summary.json").read_text())
    served = {
        f"rir/when=heuristic,where={m},what=heuristic"
        for m in (f"value:{tmp_path / 'value'}", f"prompted:{cfg.base_model}")
    }
    assert {"react", "rir/heuristic"} | served <= set(summary["methods"])
    assert "Trained controller `when=heuristic,where=value:" in text  # the headline states the value Where's result
    assert "Room: `oracle-agent`" in text and "rir/oracle-agent" in summary["methods"]

    def stamps() -> dict[str, float]:
        return {p.parent.name: p.stat().st_mtime_ns for p in tmp_path.glob("*/stage.json")}

    before = stamps()
    run_pipeline(cfg)  # nothing changed: every stage is cached
    assert stamps() == before
    run_pipeline(replace(cfg, budget_agent=12))  # only the evaluation depends on the budget
    after = stamps()
    assert after["eval-builtin"] != before["eval-builtin"]
    assert all(after[s] == before[s] for s in ("rollout-builtin", "data", "sft", "controller-eval"))


@pytest.mark.integration
def test_a_pipeline_killed_during_sft_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """`rir pipeline` killed (SIGKILL, the whole process group) once SFT has saved a checkpoint: the
    rerun keeps the rollouts and the data, and trains on from that checkpoint to max_steps."""
    max_steps = 24
    sft = load_yaml(ROOT / "configs/train/sft_cpu_quick.yaml")
    sft.update(save_steps=1, save_total_limit=None, eval_strategy="no", eval_on_start=False)
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(sft))
    out = tmp_path / "run"
    cfg = replace(
        tiny_quickstart(out),
        sft_config=str(tmp_path / "sft.yaml"),
        sft_max_steps=max_steps,
        eval_methods=["rir"],
        eval_controllers=["heuristic"],  # the evaluation is not what this test is about
    )
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(asdict(cfg)))
    cmd = [sys.executable, "-m", "rir_runtime.cli", "pipeline", "--config", str(tmp_path / "pipeline.yaml")]

    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while last_complete_checkpoint(out / "sft") is None:
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                time.sleep(0.2)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    killed_at = last_complete_checkpoint(out / "sft")
    assert killed_at is not None and int(killed_at.name.split("-")[1]) < max_steps
    episodes = {p.name: p.read_bytes() for p in (out / "rollout-builtin").glob("*.jsonl")}
    assert json.loads((out / "sft" / "stage.json").read_text())["status"] == "running"

    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "[pipeline] rollout-builtin: cached" in rerun.stderr and "[pipeline] data: cached" in rerun.stderr
    assert "[pipeline] sft: resuming an unfinished run" in rerun.stderr
    assert f"[pipeline] sft: resuming training from {killed_at}" in rerun.stderr
    assert episodes and {p.name: p.read_bytes() for p in (out / "rollout-builtin").glob("*.jsonl")} == episodes
    state = json.loads((last_complete_checkpoint(out / "sft") / "trainer_state.json").read_text())
    assert state["global_step"] == max_steps
    assert (out / "sft" / "rir_controller.json").is_file() and (out / "report.md").is_file()
