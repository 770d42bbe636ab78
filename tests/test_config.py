"""The one config mechanism: YAML defaults, CLI overrides, unknown keys named with a suggestion, and one
flag spelling (TRL's underscores, dashes as aliases; comma or space lists; `--output_dir` for `out`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.config import FlagParser, add_dataclass_arguments, build_config, parse_config


@dataclass
class Demo:
    env: str = field(default="builtin", metadata={"help": "environment", "choices": ["builtin", "scienceworld"]})
    budget_agent: int = 10
    error_rate: float = 0.15
    methods: list[str] = field(default_factory=lambda: ["rir"])
    resume: bool = True
    strict: bool = False
    model: str | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    kinds: list[str] = field(default_factory=list, metadata={"help": "kinds", "choices": ["review", "locate"]})
    out: str = field(default="runs/demo", metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        if self.budget_agent < 0:
            raise ValueError("budget_agent must be >= 0")


def parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="demo")
    p.add_argument("--config")
    add_dataclass_arguments(p, Demo, names={"methods": ["react", "rir", "self-refine"]})
    return p


def parse(argv: list[str]) -> Demo:
    return parse_config(Demo, parser().parse_args(argv))


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


def test_underscore_and_dashed_flags_give_the_same_config() -> None:
    underscore = parse(["--budget_agent", "50", "--error_rate", "0.3", "--no_resume", "--output_dir", "x"])
    dashed = parse(["--budget-agent", "50", "--error-rate", "0.3", "--no-resume", "--output-dir", "x"])
    assert underscore == dashed == Demo(budget_agent=50, error_rate=0.3, resume=False, out="x")


def test_output_dir_is_another_name_of_out(tmp_path) -> None:
    for flag in ("--out", "--output_dir", "--output-dir"):
        assert parse([flag, "elsewhere"]).out == "elsewhere"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("output_dir: from-yaml\n")
    assert parse(["--config", str(cfg)]).out == "from-yaml"
    assert parse(["--config", str(cfg), "--out", "from-flag"]).out == "from-flag"  # the flag still wins
    cfg.write_text("out: a\noutput_dir: b\n")
    with pytest.raises(UserInputError, match="sets 'out' twice"):
        parse(["--config", str(cfg)])


def test_lists_take_comma_and_space_syntax(tmp_path) -> None:
    expected = ["react", "rir", "self-refine"]
    assert parse(["--methods", "react,rir,self-refine"]).methods == expected
    assert parse(["--methods", "react", "rir", "self-refine"]).methods == expected
    assert parse(["--methods", "react", "rir,self-refine"]).methods == expected
    assert parse(["--seeds", "3", "4,5"]).seeds == [3, 4, 5]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("methods: [react, rir, self-refine]\n")
    assert parse(["--config", str(cfg)]).methods == expected


def test_booleans_take_trl_spellings() -> None:
    assert parse(["--resume"]).resume is True
    for argv in (["--resume", "false"], ["--resume=no"], ["--no_resume"], ["--no-resume"]):
        assert parse(argv).resume is False, argv


def test_a_boolean_left_unsaid_keeps_its_default_whichever_it_is(tmp_path) -> None:
    """The `--no_<flag>` switch must not set True when neither spelling is given."""
    assert parse([]).strict is False and parse([]).resume is True
    assert parse(["--strict"]).strict is True and parse(["--no_strict"]).strict is False
    cfg = tmp_path / "c.yaml"
    cfg.write_text("strict: true\n")
    assert parse(["--config", str(cfg)]).strict is True


def test_bad_flags_name_the_fix(capsys) -> None:
    for argv, message in [
        (["--budget_agnet", "3"], "unknown flag --budget_agnet. Did you mean --budget_agent?"),
        (["--error-rat=0.1"], "unknown flag --error-rat. Did you mean --error_rate?"),
        (["--budget"], "unknown flag --budget. Did you mean --budget_agent?"),  # no silent prefix match
        (["--kinds", "review,fix"], "invalid choice 'fix' (choose from review, locate)"),
        (["--resume", "maybe"], "expected true or false, not 'maybe'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            parse(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, argv


def test_help_lists_underscore_first_allowed_values_and_names(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per flag
    text = parser().format_help()
    assert "--budget_agent, --budget-agent BUDGET_AGENT" in text
    assert "--out, --output_dir, --output-dir OUT" in text
    assert "environment (choices: builtin, scienceworld; default: builtin)" in text
    assert "kinds (choices: review, locate)" in text
    assert "(names: react, rir, self-refine; default: rir)" in text
    assert "--no_resume turns it off" in text
