"""Mistake analysis: hindsight fatal steps against the expert's known injected errors."""

from __future__ import annotations

import pytest

from eval.mistakes import analyse, categorize, main
from rir_runtime.errors import UserInputError
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import StepEvent, read_records


def test_categories_name_the_fatal_verb_or_the_loop() -> None:
    assert categorize(["look", "focus on rock"], 1) == "focused on the wrong thing"
    assert categorize(["examine cookbook"] * 4, None) == "no fatal step: looped on one action"
    assert categorize(["go north", "go east", "look"], None) == "no fatal step: ran out of budget on track"


def test_fatal_steps_found_in_hindsight_are_the_injected_errors(tmp_path) -> None:
    cfg = SelectionConfig(
        env="builtin",
        tasks=["workshop-2"],
        variations="0-7",
        methods=["react", "rir"],
        error_rate=0.4,
        out=str(tmp_path),
    )
    run_jobs(expand_jobs(cfg), tmp_path / "episodes.jsonl")
    report = analyse(tmp_path)
    records = read_records(tmp_path / "episodes.jsonl")
    failed = sum(not r.success for r in records)
    assert failed and sum(report.categories.values()) == failed
    # every fatal step the analysis blames is a step the scripted expert took as a deliberate mistake
    for example in report.examples.values():
        key, _, where = example.partition(": step ")
        if not where:
            continue
        rec = next(r for r in records if r.task_spec.key == key)
        steps = [e for e in rec.events if isinstance(e, StepEvent)]
        index = int(where.split()[0])
        assert any(s.injected_error for s in steps if s.t - 1 == index)
    # restores are told apart by the controller that chose them; react never restores
    assert report.restores and {who for who, _ in report.restores} == {"rir/heuristic"}
    assert main(str(tmp_path)) == 0 and "| rir/heuristic |" in (tmp_path / "mistakes.md").read_text()


def test_missing_run_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(UserInputError, match="episodes.jsonl does not exist"):
        analyse(tmp_path)


def test_agent_going_back_and_forth_is_its_own_category() -> None:
    rooms = ["open door to hallway", "go to hallway", "open door to kitchen", "go to kitchen"] * 2
    assert categorize(rooms, None) == "no fatal step: went back and forth"
    take_put = ["put chicken wing on counter", "take chicken wing from counter"] * 4
    assert categorize(take_put, None) == "no fatal step: went back and forth"
    assert (
        categorize(["take chicken leg from fridge"] + ["prepare meal"] * 7, None)
        == "no fatal step: looped on one action"
    )
