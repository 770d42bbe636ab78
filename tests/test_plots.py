"""Plots never cost the report: error bars are never negative, and a plot that fails is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.harness import EvalConfig, evaluate
from eval.plots import error_bar, plot_success
from tests.factories import episode_record


@pytest.mark.parametrize("n", range(1, 201))
def test_error_bars_at_0_and_100_percent_are_never_negative(n: int) -> None:
    for wins in (0, n):
        low, high = error_bar(wins, n)
        assert low >= 0.0 and high >= 0.0
        assert (low == 0.0) if wins == 0 else (high == 0.0)


def test_a_method_that_wins_every_episode_is_plotted(tmp_path: Path) -> None:
    """The crash this guards: a 100% rate whose Wilson upper bound rounded below it ('xerr' negative)."""
    for n in (6, 7, 13, 100):
        records = [episode_record(variation=v, success=True, episode_id=f"e{v}") for v in range(n)]
        assert plot_success(records, tmp_path).exists()


def test_a_failing_plot_is_reported_and_skipped_and_the_report_still_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import eval.plots

    def broken(records, out):
        raise ValueError("'xerr' must not contain negative values")

    broken.__name__ = "plot_rollbacks"
    monkeypatch.setattr(eval.plots, "plot_rollbacks", broken)
    cfg = EvalConfig(env="builtin", tasks=["workshop-3"], variations="0-5", error_rate=0.3, methods=["react", "rir"])
    summary = evaluate(EvalConfig(**{**cfg.__dict__, "out": str(tmp_path)}))
    assert summary["methods"] and json.loads((tmp_path / "summary.json").read_text())["methods"]
    report = (tmp_path / "report.md").read_text()
    assert "success_rate.png" in report and "rollbacks.png" not in report
    assert "skipped plot plot_rollbacks" in capsys.readouterr().err
