"""The one parser of controller names (rir_runtime/controllers/spec.py) and its registry: every spelling
round-trips, bad names are refused with the kinds listed, and a kind registered once is served by every
command, end to end."""

from __future__ import annotations

import pytest

from rir_runtime.controllers import (
    CompositeController,
    ControllerKind,
    ControllerSpec,
    ExploringController,
    HeuristicController,
    SignalGatedController,
    check_controller_name,
    make_controller,
)
from rir_runtime.controllers.spec import KINDS, spellings
from rir_runtime.decisions import Decision, Review
from rir_runtime.errors import UnknownNameError, UserInputError
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.prompts import DecisionContext
from rir_runtime.trace.events import ReviewEvent
from tests.factories import ScriptedBackend


@pytest.mark.parametrize(
    "name",
    [
        "heuristic",
        "oracle",
        "oracle-agent",
        "oracle-agent:4",
        "prompted:smollm2-135m-instruct",
        "tuned:runs/sft",
        "value:runs/value",
        "gated:tuned:runs/sft",
        "residual:prompted:openai:m@http://h:8000/v1",
        "random-review",
        "when=heuristic;where=value:runs/v;what=heuristic",
        "when=gated:prompted:m;where=oracle-agent:2;what=heuristic",
    ],
)
def test_every_spelling_round_trips(name: str) -> None:
    assert str(ControllerSpec.parse(name)) == name


def test_a_spec_says_what_its_modules_are() -> None:
    swap = ControllerSpec.parse("when=heuristic;where=value:runs/v;what=tuned:runs/t")
    assert [p.kind for p in swap.parts] == ["heuristic", "value", "tuned"]
    assert swap.uses_trained_model and not swap.uses_hindsight
    assert swap.arguments_of("tuned") == ["runs/t"]
    assert ControllerSpec.parse("when=oracle-agent;where=heuristic;what=heuristic").uses_hindsight
    gated = ControllerSpec.parse("gated:prompted:openai:m@http://h:8000/v1")
    assert (gated.gate, gated.kind, gated.argument) == ("gated", "prompted", "openai:m@http://h:8000/v1")
    assert not gated.uses_trained_model


def test_a_composite_reads_as_it_names_itself_in_records() -> None:
    records_name = "when=heuristic,where=oracle-agent,what=heuristic"
    spec = ControllerSpec.parse(records_name)
    assert str(spec) == "when=heuristic;where=oracle-agent;what=heuristic" and spec.uses_hindsight


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("heuristc", "Did you mean 'heuristic'"),
        ("tuned", "unknown controller 'tuned'"),  # the adapter folder is missing
        ("heuristic:3", "unknown controller 'heuristic:3'"),  # a rule takes no argument
        ("gated:heuristic", "a rule has none"),  # nothing for a gate to save
        ("when=heuristic;where=heuristic", "composite controller part 'what'"),
    ],
)
def test_a_bad_name_is_refused_with_the_kinds(name: str, complaint: str) -> None:
    with pytest.raises(UnknownNameError, match=complaint) as err:
        ControllerSpec.parse(name)
    if "composite" not in complaint:
        assert "tuned:<adapter-folder>" in str(err.value) and "when=<name>;where=<name>;what=<name>" in str(err.value)


def test_checks_before_any_episode_read_what_a_name_points_at(tmp_path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        check_controller_name(f"when=heuristic;where=value:{tmp_path / 'missing'};what=heuristic")
    with pytest.raises(UserInputError, match="whole number"):
        check_controller_name("oracle-agent:x")
    assert check_controller_name("oracle-agent:3").argument == "3"


def test_names_build_the_controllers_they_name() -> None:
    asked: list[str] = []
    gated = make_controller("gated:prompted:fake", lambda model: asked.append(model) or ScriptedBackend([]))
    assert isinstance(gated, SignalGatedController) and gated.name == "gated:prompted:fake" and asked == ["fake"]
    swap = make_controller(ControllerSpec.parse("when=heuristic;where=random-restore;what=heuristic"))
    assert isinstance(swap, CompositeController) and isinstance(swap.where, ExploringController)


class Restless(HeuristicController):
    """A test-only kind: recovers at every scheduled review."""

    name = "restless"

    def review(self, ctx: DecisionContext) -> Decision:
        return Decision("review", Review("recover", "restless: always"))


def test_a_kind_registered_once_is_served_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(KINDS, "restless", ControllerKind("restless", lambda spec, backends: Restless()))
    assert "restless" in spellings()
    name = "when=restless;where=heuristic;what=heuristic"
    cfg = SelectionConfig(
        env="builtin", tasks=["workshop-2"], variations="0-3", methods=["rir"], controller=[name], out=str(tmp_path)
    )
    records = run_jobs(expand_jobs(cfg), tmp_path / "episodes.jsonl")
    assert {ControllerSpec.parse(r.controller) for r in records} == {ControllerSpec.parse(name)}  # as it names itself
    reviews = [e for r in records for e in r.events if isinstance(e, ReviewEvent) and e.trigger == "schedule"]
    assert reviews and all(e.recover for e in reviews)
    assert sum(r.recoveries for r in records) > 0
