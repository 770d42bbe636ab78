"""The one config mechanism: YAML defaults, CLI overrides, unknown keys named with a suggestion."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from rir_runtime.config import add_dataclass_arguments, build_config, parse_config
from rir_runtime.errors import UserInputError


@dataclass
class Demo:
    env: str = field(default="builtin", metadata={"help": "environment", "choices": ["builtin", "scienceworld"]})
    budget_agent: int = 10
    error_rate: float = 0.15
    methods: list[str] = field(default_factory=lambda: ["rir"])
    resume: bool = True
    model: str | None = None

    def __post_init__(self) -> None:
        if self.budget_agent < 0:
            raise ValueError("budget_agent must be >= 0")


def parse(argv: list[str]) -> Demo:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    add_dataclass_arguments(p, Demo)
    return parse_config(Demo, p.parse_args(argv))


def test_yaml_then_flags_override(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budget_agent: 30\nmethods: [react, rir]\nerror-rate: 0.3\n")
    out = parse(["--config", str(cfg), "--budget-agent", "50", "--no-resume", "--model", "none"])
    assert out == Demo(budget_agent=50, methods=["react", "rir"], error_rate=0.3, resume=False, model=None)
    assert parse(["--methods", "react,self-refine"]).methods == ["react", "self-refine"]


def test_unknown_key_is_named_with_suggestion(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budget_agnet: 3\n")
    with pytest.raises(UserInputError, match="unknown key 'budget_agnet'.*Did you mean 'budget_agent'"):
        parse(["--config", str(cfg)])


def test_bad_values_and_files_are_clear(tmp_path) -> None:
    with pytest.raises(UserInputError, match="'budget_agent': cannot read 'many' as int"):
        build_config(Demo, {"budget_agent": "many"})
    with pytest.raises(UserInputError, match="budget_agent must be >= 0"):
        build_config(Demo, {"budget_agent": -1})
    with pytest.raises(UserInputError, match="does not exist"):
        parse(["--config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(UserInputError, match="not valid YAML"):
        parse(["--config", str(bad)])
