"""The episode trace: typed events round-trip, the reader refuses what it cannot read (naming the
file and line), one replay rebuilds every branch, and schema-1 files convert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.mistakes import after_restores
from rir_runtime.decisions import Failure, Reflection
from rir_runtime.memory import MemorySnapshot
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.trace import (
    TRACE_SCHEMA_VERSION,
    EpisodeRecord,
    ReflectEvent,
    ResetEvent,
    RestoreEvent,
    ReviewEvent,
    StepEvent,
    TraceError,
    read_records,
    replay,
)
from rir_runtime.trace.upgrade import upgrade_run
from tests.factories import episode_record


def record_of(*events) -> EpisodeRecord:
    return episode_record(*events, task="workshop-2", agent_calls=0, env_steps=0)


def steps(start: int, actions: str) -> list[StepEvent]:
    return [StepEvent(start + i + 1, a, f"after {a}", 0.0) for i, a in enumerate(actions)]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    cfg = SelectionConfig(env="builtin", tasks=["workshop-3"], variations="0-5", methods=["rir"], error_rate=0.3)
    run_jobs(expand_jobs(cfg), out / "episodes.jsonl")
    return out / "episodes.jsonl"


def test_records_round_trip_through_their_file(run_file: Path) -> None:
    records = read_records(run_file)
    assert len(records) == 6 and all(isinstance(r, EpisodeRecord) for r in records)
    assert any(isinstance(e, ReflectEvent) for r in records for e in r.events)  # nested types come back typed
    for line, record in zip(run_file.read_text().splitlines(), records, strict=True):
        assert json.loads(line) == record.to_json() and json.loads(line)["schema"] == TRACE_SCHEMA_VERSION
        assert EpisodeRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema=99), "trace schema 99"),
        (lambda d: d.pop("schema"), "rir trace upgrade"),
        (lambda d: d.pop("success"), r"lacks field\(s\) \['success'\]"),
        (lambda d: d.update(colour="red"), r"unknown field\(s\) \['colour'\]"),
        (lambda d: d.update(agent_calls="many"), "'agent_calls' must be int"),
        (lambda d: d["events"].append({"type": "teleport", "t": 0}), "unknown event type 'teleport'"),
        (lambda d: d["events"].append({"type": "step", "t": 1}), "missing"),
        (lambda d: d["events"].append({"type": "restore", "t": 1, "to": "zero", "k": 1}), "'to' must be int"),
    ],
    ids=["future-schema", "schema-1", "missing-field", "unknown-field", "bad-type", "unknown-event", "bad-event",
         "bad-event-type"],
)  # fmt: skip
def test_reader_names_file_line_and_problem(run_file: Path, tmp_path: Path, change, message: str) -> None:
    lines = run_file.read_text().splitlines()
    broken = json.loads(lines[2])
    change(broken)
    path = tmp_path / "episodes.jsonl"
    path.write_text("\n".join(lines[:2] + [json.dumps(broken)] + lines[3:]) + "\n")
    with pytest.raises(TraceError, match=f"{path}:3: .*{message}"):
        read_records(path)


def test_a_partial_last_line_is_a_killed_run_and_is_rerun(run_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    text = run_file.read_text()
    path.write_text(text[: text.rfind("\n", 0, len(text) - 1) + 40])  # the last record cut mid-write
    with pytest.warns(UserWarning, match="partial last line"):
        assert len(read_records(path)) == 5
    cfg = SelectionConfig(env="builtin", tasks=["workshop-3"], variations="0-5", methods=["rir"], error_rate=0.3)
    run_jobs(expand_jobs(cfg), path)  # resumes: the cut episode runs again, the rest are kept
    assert [r.episode_id for r in read_records(path)] == [r.episode_id for r in read_records(run_file)]


def test_replay_splits_branches_at_restores() -> None:
    events = [ResetEvent(0, "start", "goal"), *steps(0, "abcd"), RestoreEvent(4, to=1, k=3), *steps(1, "e")]
    branches = replay(record_of(*events)).branches
    assert [(b.actions, b.ended_by, b.restore_to) for b in branches] == [
        (list("abcd"), "restore", 1),
        (["a", "e"], "lost", None),
    ]


def test_replay_gives_each_review_the_branch_and_memory_it_saw() -> None:
    failure = Failure("after seeing: after a", "b", "lost", "do not 'b'")
    memory = MemorySnapshot(failures=(failure,))
    events = [
        ResetEvent(0, "start", "goal"),
        *steps(0, "abc"),
        ReviewEvent(3, "terminal", "recover", "lost"),
        ReflectEvent(3, restore_point=1, reflection=Reflection(failure=failure), memory=memory),
        RestoreEvent(3, to=1, k=2),
        ReviewEvent(1, "schedule", "continue", "fine"),
    ]
    trace = replay(record_of(*events))
    first, second = trace.reviews
    assert [s.action for s in first.steps] == list("abc") and first.memory == MemorySnapshot()
    assert first.reflect is not None and first.restore is not None and first.restore.to == 1
    assert [s.action for s in second.steps] == ["a"] and second.observation == "after a"
    assert second.memory == memory  # the reflection survives the rollback
    assert trace.objective == "goal"


def test_replay_refuses_a_step_out_of_order() -> None:
    with pytest.raises(TraceError, match="step event at t=5 on a branch of 0 steps"):
        replay(record_of(StepEvent(5, "a", "x", 0.0)))


def test_after_restores_tells_a_repeated_action_from_a_new_one() -> None:
    events = [
        *steps(0, "abc"),
        RestoreEvent(3, to=1, k=2),
        *steps(1, "bd"),
        RestoreEvent(3, to=1, k=2),
        *steps(1, "e"),
        RestoreEvent(2, to=2, k=0),
    ]
    counts = after_restores(replay(record_of(*events)).branches)
    assert counts == {"the abandoned action again": 1, "another action": 1}


def test_schema_1_files_convert_and_then_read(run_file: Path, tmp_path: Path) -> None:
    """A schema-1 line: no version, a `locate` event that carried an error, optional fields absent."""
    v1 = []
    for line in run_file.read_text().splitlines():
        data = json.loads(line)
        del data["schema"], data["restore_divergences"], data["oracle_env_steps"]
        for event in data["events"]:
            event.pop("first_error", None)
        data["events"].append({"type": "locate", "t": 0, "error": "no admissible checkpoint"})
        v1.append(json.dumps(data))
    (tmp_path / "episodes.jsonl").write_text("\n".join(v1) + "\n")
    with pytest.raises(TraceError, match="rir trace upgrade"):
        read_records(tmp_path / "episodes.jsonl")
    assert upgrade_run(tmp_path) == {str(tmp_path / "episodes.jsonl"): 6}
    records = read_records(tmp_path / "episodes.jsonl")
    assert (tmp_path / "episodes.jsonl.v1.bak").exists() and len(records) == 6
    assert all(r.events[-1].type == "locate_failed" and r.restore_divergences == 0 for r in records)
    original = read_records(run_file)
    assert [(r.episode_id, r.success, r.stop_reason) for r in records] == [
        (r.episode_id, r.success, r.stop_reason) for r in original
    ]
    assert [replay(r).branches for r in records] == [replay(r).branches for r in original]


def test_a_schema_2_line_is_read_with_the_controllers_calls_taken_out_of_the_agents(tmp_path: Path) -> None:
    """Schema 2 charged a model-backed controller's calls to B_agent and counted them in agent_calls."""
    current = episode_record(agent_calls=7, controller_calls=3, controller_decisions=5, charge_controller=True)
    old = {k: v for k, v in current.to_json().items() if not k.startswith(("controller_", "charge_", "budget_c"))}
    old |= {"schema": 2, "agent_calls": 10, "controller_calls": 5, "controller_model_calls": 3}
    unknown = {**old, "controller_model_calls": None}  # written before schema 2 recorded them
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(unknown) + "\n")
    converted, predates = read_records(path)
    assert converted == current
    assert predates.controller_calls is None and predates.agent_calls == 10 and predates.charge_controller
    upgrade_run(tmp_path)  # and `rir trace upgrade` writes the same conversion
    assert read_records(path)[0] == current and json.loads(path.read_text().splitlines()[0])["schema"] == 3
