"""Mistake analysis: hindsight fatal steps against the expert's known injected errors."""

from __future__ import annotations

import json

import pytest

from eval.mistakes import after_restores, analyse, branches, categorize, main
from rir_runtime.errors import UserInputError
from rir_runtime.jobs import SelectionConfig, expand_jobs, run_jobs


def test_branches_split_at_restores() -> None:
    events = [{"type": "step", "action": a} for a in "abcd"] + [
        {"type": "restore", "to": 1, "k": 3},
        {"type": "step", "action": "e"},
    ]
    parts = branches(events, "won")
    assert [(b.actions, b.ended_by, b.restore_to) for b in parts] == [
        (list("abcd"), "restore", 1),
        (["a", "e"], "won", None),
    ]


def test_after_restores_tells_a_repeated_action_from_a_new_one() -> None:
    def steps(actions: str) -> list[dict]:
        return [{"type": "step", "action": a} for a in actions]

    def restore(to: int, k: int) -> list[dict]:
        return [{"type": "restore", "to": to, "k": k}]

    events = steps("abc") + restore(1, 2) + steps("bd") + restore(1, 2) + steps("e") + restore(2, 0)
    assert after_restores(branches(events, "lost")) == {"the abandoned action again": 1, "another action": 1}


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
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    failed = sum(not r["success"] for r in records)
    assert failed and sum(report.categories.values()) == failed
    # every fatal step the analysis blames is a step the scripted expert took as a deliberate mistake
    for example in report.examples.values():
        key, _, where = example.partition(": step ")
        if not where:
            continue
        rec = next(r for r in records if f"{r['env']}/{r['task']}/{r['split']}/{r['variation']}" == key)
        steps = [e for e in rec["events"] if e["type"] == "step"]
        index = int(where.split()[0])
        assert any(s["injected_error"] for s in steps if s["t"] - 1 == index)
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
