"""The pipeline's headline names a winner only where the paired test says so, and a served form with
a `{model}` slot meets its fair control (the same form with the prompted base)."""

from __future__ import annotations

from pathlib import Path

from eval.pipeline import PipelineConfig, Suite, controller_specs, final_report, headline
from eval.summary import summarize
from tests.factories import episode_record


def summary_of(outcomes: dict[str, str]) -> dict:
    """A summary.json body from one string of outcomes per method key ('1' success), one variation each."""
    records = [
        episode_record(method=key.partition("/")[0], controller=key.partition("/")[2] or "-", variation=v,
                       success=c == "1", episode_id=f"{key}/{v}")
        for key, results in outcomes.items()
        for v, c in enumerate(results)
    ]  # fmt: skip
    return summarize(records, config={})


def test_a_tie_names_no_winner_and_gives_the_discordant_counts() -> None:
    """The quickstart's old headline broke a 0 vs 0 tie by agent calls, which always favours the rule."""
    summary = summary_of({"rir/heuristic": "11110000", "rir/prompted:m": "11110000", "react": "11110000"})
    line = " ".join(headline([summary]))
    assert "Winner" not in line and "No significant difference" in line and "0 vs 0 discordant, p = 1" in line


def test_a_lead_that_the_test_does_not_support_names_no_winner() -> None:
    summary = summary_of({"rir/tuned:a": "1111100000", "rir/heuristic": "1110000000"})  # 2 vs 0: p = 0.5
    line = " ".join(headline([summary]))
    assert "Winner" not in line and "2 vs 0 discordant, p = 0.5" in line


def test_a_significant_lead_over_every_other_controller_is_a_winner() -> None:
    summary = summary_of({"rir/tuned:a": "1" * 12 + "0" * 4, "rir/heuristic": "0" * 16, "rir/oracle": "0" * 16})
    lines = headline([summary])
    assert lines[0].startswith("**Winner: `tuned:a`**") and "12 vs 0 discordant" in lines[0]


def test_a_winner_must_beat_every_other_controller_not_only_the_runner_up() -> None:
    summary = summary_of(
        {"rir/tuned:a": "1" * 12 + "0" * 4, "rir/heuristic": "1" * 11 + "0" * 5, "rir/prompted:m": "0" * 16}
    )
    assert "No significant difference" in headline([summary])[0]


def test_a_served_form_with_a_model_slot_is_evaluated_with_the_adapter_and_its_prompted_base() -> None:
    cfg = PipelineConfig(base_model="gemma3-270m")
    form = "when=residual:{model};where={model};what=heuristic"
    assert controller_specs(form, cfg, Path("runs/x/sft")) == [
        "when=residual:tuned:runs/x/sft;where=tuned:runs/x/sft;what=heuristic",
        "when=residual:prompted:gemma3-270m;where=prompted:gemma3-270m;what=heuristic",
    ]
    assert controller_specs("tuned", cfg, Path("a")) == ["tuned:a"]
    assert controller_specs("heuristic", cfg, Path("a")) == ["heuristic"]


def test_value_names_the_value_controller_and_is_refused_without_one() -> None:
    import pytest

    from rir_runtime.errors import UserInputError

    cfg = PipelineConfig()
    assert controller_specs("value", cfg, Path("runs/x/sft"), Path("runs/x/value")) == ["value:runs/x/value"]
    with pytest.raises(UserInputError, match="no value_config"):
        controller_specs("value", cfg, Path("runs/x/sft"))


def test_slots_serve_the_value_controller_and_the_base_in_a_composed_form() -> None:
    import pytest

    from rir_runtime.errors import UserInputError

    cfg = PipelineConfig()
    form = "when=heuristic;where={value};what=heuristic"
    assert controller_specs(form, cfg, Path("runs/x/sft"), Path("runs/x/value")) == [
        "when=heuristic;where=value:runs/x/value;what=heuristic"
    ]
    its_control = "when=heuristic;where={prompted};what=heuristic"  # the same form with the base model
    assert controller_specs(its_control, cfg, Path("runs/x/sft")) == [
        f"when=heuristic;where=prompted:{cfg.base_model};what=heuristic"
    ]
    with pytest.raises(UserInputError, match="where=\\{value\\}.*no value_config"):
        controller_specs(form, cfg, Path("runs/x/sft"))


def test_the_trained_controller_is_stated_against_the_rule_and_the_base_even_when_it_is_not_best() -> None:
    summary = summary_of({"rir/heuristic": "1111111100", "rir/value:v": "1111110000", "rir/prompted:m": "1100000000"})
    lines = headline([summary])
    assert lines[0].startswith("**No significant difference**")
    assert lines[1] == (
        "Trained controller `value:v` (60.0%): vs `heuristic` (80.0%) 0 vs 2 discordant, p = 0.5; "
        "vs `prompted:m` (20.0%) 4 vs 0 discordant, p = 0.125."
    )


def test_a_composed_form_that_serves_an_adapter_is_stated_as_a_trained_controller() -> None:
    where_value = "when=heuristic,where=value:v,what=heuristic"  # summary keys write the form with commas
    where_base = "when=heuristic,where=prompted:m,what=heuristic"
    outcomes = {"rir/heuristic": "1100000000", f"rir/{where_value}": "1111110000", f"rir/{where_base}": "1000000000"}
    summary = summary_of(outcomes)
    lines = headline([summary])
    assert len(lines) == 2 and lines[1] == (
        f"Trained controller `{where_value}` (60.0%): vs `heuristic` (20.0%) 4 vs 0 discordant, p = 0.125; "
        f"vs `{where_base}` (10.0%) 5 vs 0 discordant, p = 0.0625."
    )


def test_every_trained_adapter_is_scored_offline_even_when_none_runs_online() -> None:
    from eval.pipeline import offline_controllers

    sft, dpo = Path("runs/x/sft"), Path("runs/x/dpo")
    online = ["heuristic", "prompted:m", "tuned:runs/x/dpo", "oracle-agent"]
    assert offline_controllers(online, [sft, dpo]) == [
        "heuristic",
        "prompted:m",
        "tuned:runs/x/sft",
        "tuned:runs/x/dpo",
    ]
    assert offline_controllers(["heuristic", "value:runs/x/value"], [sft]) == [
        "heuristic",
        "value:runs/x/value",
        "tuned:runs/x/sft",
    ]
    served = "when=tuned:runs/x/sft;where=tuned:runs/x/sft;what=heuristic"  # uses the adapter already
    assert offline_controllers([served], [sft]) == [served]


def test_the_oracles_bound_the_headline_and_never_win_it() -> None:
    """`oracle-agent` knows the episode's future: the headline ranks the others and states the room it
    leaves over the heuristic, and the share of it the trained controller took."""
    where_oracle = "when=heuristic,where=oracle-agent,what=heuristic"
    summary = summary_of(
        {
            "rir/oracle-agent": "1" * 10,
            f"rir/{where_oracle}": "1" * 10,
            "rir/value:v": "1" * 6 + "0" * 4,
            "rir/heuristic": "1" * 2 + "0" * 8,
        }
    )
    lines = headline([summary])
    assert "oracle" not in lines[0] and "`value:v` 60.0%" in lines[0]
    assert lines[-1] == (
        "Room: `oracle-agent` (hindsight from this agent's own continuations: an upper bound, not a contender) "
        "100.0%, +80.0 points over `heuristic` (8 vs 0 discordant, p = 0.00781); share of it taken: `value:v` +50%."
    )
    no_room = summary_of({"rir/oracle-agent": "11", "rir/heuristic": "11", "rir/value:v": "10"})
    assert headline([no_room])[-1].endswith("(0 vs 0 discordant, p = 1).")


def test_an_offline_section_on_few_rows_says_it_is_a_smoke_test(tmp_path: Path) -> None:
    ce = tmp_path / "controller-eval"
    ce.mkdir()
    (ce / "controller_eval.md").write_text("# Controller decision quality (validation)\n\n| controller |\n| --- |\n")
    no_test = [Suite(test_variations="")]
    few = final_report(PipelineConfig(suites=no_test, controller_eval_rows=8), ce, [], {}, 1.0)
    enough = final_report(PipelineConfig(suites=no_test, controller_eval_rows=200), ce, [], {}, 1.0)
    assert "smoke test: 8 held-out rows a dataset" in few and "--controller_eval_rows 200" in few
    assert "smoke test" not in enough
