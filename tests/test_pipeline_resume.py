"""The stage cache of `rir pipeline` (and `rir train agent`): a rerun resumes a killed stage in place,
skips a done one, and clears one whose settings changed only after saying which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rir_runtime.orchestration.stages import Stages


class Killed(Exception):
    """Stands for a kill in the middle of a stage."""


def test_a_stage_killed_midway_keeps_its_work_and_runs_again(tmp_path: Path, capsys) -> None:
    seen = []

    def killed(folder: Path) -> None:  # writes one episode, then dies
        with (folder / "episodes.jsonl").open("a") as f:
            f.write('{"episode": 0}\n')
        raise Killed

    def resumed(folder: Path) -> None:  # appends what is missing, as the real stages do
        seen.append((folder / "episodes.jsonl").is_file())
        with (folder / "episodes.jsonl").open("a") as f:
            f.write('{"episode": 1}\n')

    with pytest.raises(Killed):
        Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, killed)
    Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, resumed)
    episodes = (tmp_path / "rollout-builtin" / "episodes.jsonl").read_text().splitlines()
    assert episodes == ['{"episode": 0}', '{"episode": 1}'], "the rerun deleted the killed stage's episodes"
    assert seen == [True]
    assert "[pipeline] rollout-builtin: resuming an unfinished run" in capsys.readouterr().err


def test_a_done_stage_whose_records_were_torn_afterwards_runs_again_in_place(tmp_path: Path, capsys) -> None:
    """A kill or a tear that strikes a finished stage's file must not leave later stages reading it torn."""
    runs = []

    def rollout(folder: Path) -> None:  # resumes as the real stage does: cuts a torn last line, appends the rest
        path = folder / "episodes.jsonl"
        kept = [line for line in (path.read_text().split("\n") if path.exists() else []) if line.endswith("}")]
        path.write_text("".join(f"{line}\n" for line in kept))
        with path.open("a") as f:
            for i in range(len(kept), 2):
                f.write(f'{{"episode": {i}}}\n')
        runs.append(len(kept))

    Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, rollout)
    Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, rollout)
    assert runs == [0] and "rollout-builtin: cached" in capsys.readouterr().err
    episodes = tmp_path / "rollout-builtin" / "episodes.jsonl"
    episodes.write_bytes(episodes.read_bytes()[:-4])  # the last line torn after the stage finished
    Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, rollout)
    assert runs == [0, 1] and episodes.read_text() == '{"episode": 0}\n{"episode": 1}\n'
    assert "episodes.jsonl changed after it finished (torn or edited)" in capsys.readouterr().err
    Stages(tmp_path).run("rollout-builtin", {"variations": "0-1"}, rollout)
    assert runs == [0, 1] and "rollout-builtin: cached" in capsys.readouterr().err


def test_stage_json_is_written_at_the_start_and_updated_at_the_end(tmp_path: Path) -> None:
    records = []
    stages = Stages(tmp_path)
    stages.run("data", {"max_prompt_tokens": 512}, lambda d: None)
    stages.run("sft", {"sft_max_steps": 16}, lambda d: records.append(json.loads((d / "stage.json").read_text())))
    (running,) = records
    done = json.loads((tmp_path / "sft" / "stage.json").read_text())
    assert running["status"] == "running" and done["status"] == "done"
    assert running["settings"] == done["settings"] == {"sft_max_steps": 16}
    assert running["inputs"] == {} and running["key"] == done["key"] == stages.keys["sft"]
    stages.run("eval", {"budget_agent": 40}, lambda d: None, inputs=["sft", "data"])
    inputs = json.loads((tmp_path / "eval" / "stage.json").read_text())["inputs"]
    assert inputs == {"sft": stages.keys["sft"], "data": stages.keys["data"]}


def test_a_changed_setting_clears_the_stage_and_names_the_setting(tmp_path: Path, capsys) -> None:
    def train(folder: Path) -> None:
        (folder / "checkpoint-8").mkdir()

    Stages(tmp_path).run("sft", {"sft_max_steps": 16, "sft_config": {"lr": 0.1}}, train)
    (tmp_path / "sft" / "stale.txt").write_text("made with 16 steps")
    capsys.readouterr()
    Stages(tmp_path).run("sft", {"sft_max_steps": 20, "sft_config": {"lr": 0.2}}, train)
    assert not (tmp_path / "sft" / "stale.txt").exists() and (tmp_path / "sft" / "checkpoint-8").is_dir()
    err = capsys.readouterr().err
    assert "[pipeline] sft: sft_max_steps 16 -> 20; sft_config.lr 0.1 -> 0.2: clearing" in err


def test_a_changed_input_redoes_the_stages_that_read_it(tmp_path: Path, capsys) -> None:
    calls = []

    def pipeline(tokens: int) -> None:
        stages = Stages(tmp_path)
        stages.run("data", {"max_prompt_tokens": tokens}, lambda d: calls.append("data"))
        stages.run("sft", {"sft_max_steps": 16}, lambda d: calls.append("sft"), inputs=["data"])

    pipeline(512)
    capsys.readouterr()
    pipeline(1024)
    assert calls == ["data", "sft", "data", "sft"]
    err = capsys.readouterr().err
    assert "data: max_prompt_tokens 512 -> 1024" in err and "sft: its input 'data' changed" in err


def test_a_done_stage_with_the_same_settings_is_not_called(tmp_path: Path, capsys) -> None:
    calls = []
    for _ in range(2):
        Stages(tmp_path).run("eval-builtin", {"budget_agent": 40}, lambda d: calls.append(d))
    assert len(calls) == 1
    assert "[pipeline] eval-builtin: cached" in capsys.readouterr().err


def test_a_folder_without_stage_json_is_refused_not_cleared(tmp_path: Path) -> None:
    from rir_runtime.errors import UserInputError

    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "adapter_model.safetensors").write_text("whose?")
    calls = []
    with pytest.raises(UserInputError, match="holds files but no readable stage.json.*move them elsewhere"):
        Stages(tmp_path).run("sft", {"sft_max_steps": 16}, lambda d: calls.append(d))
    assert (tmp_path / "sft" / "adapter_model.safetensors").read_text() == "whose?" and calls == []
    (tmp_path / "sft" / "adapter_model.safetensors").unlink()
    (tmp_path / "sft" / "stage.tmp").write_text("{")  # a kill while the record was first written
    Stages(tmp_path).run("sft", {"sft_max_steps": 16}, lambda d: calls.append(d))
    assert len(calls) == 1


def test_a_marker_of_the_previous_version_counts_as_done(tmp_path: Path, capsys) -> None:
    stages = Stages(tmp_path)
    stages.run("sft", {"sft_max_steps": 16}, lambda d: None)
    marker = tmp_path / "sft" / "stage.json"
    marker.write_text(json.dumps({"key": stages.keys["sft"], "wall_s": 12.0}) + "\n")  # only key + wall_s
    calls = []
    Stages(tmp_path).run("sft", {"sft_max_steps": 16}, lambda d: calls.append(d))
    assert calls == [] and "sft: cached" in capsys.readouterr().err
    Stages(tmp_path).run("sft", {"sft_max_steps": 20}, lambda d: calls.append(d))  # another key: redone
    assert len(calls) == 1
    assert "its stage.json comes from an older version, which recorded no settings" in capsys.readouterr().err


def test_a_stage_cannot_read_a_stage_that_has_not_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"stage sft reads \['data'\], which have not run yet"):
        Stages(tmp_path).run("sft", {}, lambda d: None, inputs=["data"])
