"""The `rir` command line: one flag spelling on every stage, `rir --version` and `rir env`."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from eval.harness import EvalConfig
from rir_runtime.cli import build_parser, main, stage_config
from rir_runtime.commands import env as env_report
from rir_runtime.controllers.spec import spellings as controller_spellings
from rir_runtime.llm.registry import MODELS
from rir_runtime.policies import MODES
from rir_runtime.recovery import PRESETS

STAGES = ("run", "eval", "eval-controller", "pipeline", "rollout", "build-data")


def eval_config(argv: list[str]) -> EvalConfig:
    return stage_config(build_parser().parse_args(["eval", *argv]), EvalConfig)


def test_eval_takes_trl_spelling_and_dashes_alike() -> None:
    values = {"max_steps": "7", "budget_rollback": "2", "policy_mode": "generate", "output_dir": "o"}
    underscore = eval_config([arg for key, value in values.items() for arg in (f"--{key}", value)])
    dashed = eval_config([arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", value)])
    assert underscore == dashed
    assert (underscore.max_steps, underscore.budget_rollback, underscore.policy_mode) == (7, 2, "generate")
    assert underscore.out == "o"


def test_eval_lists_take_comma_and_space_syntax() -> None:
    spaced = eval_config(["--methods", "react", "rir", "--seeds", "0", "1", "--budget_sweep", "1x", "2x"])
    commas = eval_config(["--methods", "react,rir", "--seeds", "0,1", "--budget-sweep", "1x,2x"])
    assert spaced == commas
    assert (spaced.methods, spaced.seeds, spaced.budget_sweep) == (["react", "rir"], [0, 1], ["1x", "2x"])


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_takes_output_dir_for_out(stage: str) -> None:
    for flag in ("--out", "--output_dir", "--output-dir"):
        assert build_parser().parse_args([stage, flag, "somewhere"]).out == "somewhere"


def test_unknown_flag_names_the_nearest_one(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--max_step", "3"])
    assert exit_info.value.code == 2
    assert "unknown flag --max_step. Did you mean --max_steps?" in capsys.readouterr().err


def test_help_shows_allowed_values_and_names(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    assert "--max_steps, --max-steps MAX_STEPS" in text
    assert "choices: " + ", ".join(MODES) in text
    assert "names: " + ", ".join(PRESETS) in text
    assert "names: " + ", ".join(controller_spellings()) in text
    assert "--out, --output_dir, --output-dir OUT" in text


def test_version_is_the_package_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rir {md.version('rir')}\n"


def test_env_reports_versions_devices_java_caches_platform(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))  # an empty cache: nothing prepared
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    for title in ("Versions:", "Devices:", "Java:", "Caches:", "Platform:"):
        assert f"\n{title}\n" in text
    for dist in ("rir", *env_report.PACKAGES):
        assert f"- {dist}: {env_report.package_version(dist)}" in text
    assert "- CUDA available: " in text and "- GPUs: " in text
    assert f"- RIR_CACHE_DIR: {tmp_path}" in text
    assert "- prepared models: none" in text
    assert f"- not prepared: {', '.join(MODELS)} (`rir models prepare <name>`)" in text


def test_env_says_what_a_missing_java_breaks(monkeypatch, capsys) -> None:
    monkeypatch.setattr(env_report.shutil, "which", lambda name: None)
    assert main(["env"]) == 0
    assert "- java: not found: `--env scienceworld` cannot start" in capsys.readouterr().out


def test_env_lists_visible_gpus(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU-{i}")
    rows = dict(env_report.devices().rows)
    assert rows["GPUs"] == "2: GPU-0, GPU-1"
    assert rows["local models run on"] == "cuda"


def test_push_sends_the_folder_to_the_named_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rir push adapter|dataset` is train.hub's push with the repository private unless --public."""
    import train.hub

    calls = []
    monkeypatch.setattr(train.hub, "push_adapter", lambda *a, **k: calls.append(("adapter", a, k)) or "url-a")
    monkeypatch.setattr(train.hub, "push_dataset", lambda *a, **k: calls.append(("dataset", a, k)) or "url-d")
    assert main(["push", "adapter", "runs/sft", "me/ctrl"]) == 0
    assert main(["push", "dataset", "data/x/review_sft", "me/data", "--public"]) == 0
    assert calls == [
        ("adapter", ("runs/sft", "me/ctrl"), {"private": True}),
        ("dataset", ("data/x/review_sft", "me/data"), {"private": False}),
    ]
