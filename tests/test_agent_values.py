"""Agent-relative hindsight values: the controlled agent's own chance from each checkpoint, cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_gen.build import build
from data_gen.build_config import BuildConfig
from data_gen.rollout import RolloutConfig, rollout
from rir_runtime.errors import UserInputError


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent-values-rollout")
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-5", error_rate=0.3, out=str(out)))
    return out


def labels(folder: Path) -> dict[str, dict]:
    return {row["point_id"]: row for row in map(json.loads, (folder / "labels.jsonl").read_text().splitlines())}


def test_the_agent_never_does_better_than_the_expert_and_sometimes_worse(run: Path, tmp_path: Path) -> None:
    """On the workshop the expert replans optimally, so the error-injected agent cannot win where the
    expert cannot; at error rate 0.3 it often fails where the expert would not."""
    expert, agent = tmp_path / "expert", tmp_path / "agent"
    build(BuildConfig(rollouts=[str(run)], out=str(expert), bisect=False))
    build(BuildConfig(rollouts=[str(run)], out=str(agent), bisect=False, label_value="agent", value_rollouts=2))
    by_expert, by_agent = labels(expert), labels(agent)
    assert set(by_expert) == set(by_agent)
    pairs = [
        (by_expert[p]["values"][i], v) for p in by_agent for i, v in by_agent[p]["values"].items()
    ]  # fmt: skip
    assert pairs and all(a <= e for e, a in pairs)
    assert any(a < e for e, a in pairs)
    assert {v for _, v in pairs} <= {0.0, 0.5, 1.0}  # K = 2 continuations
    assert (agent / "agent_values.jsonl").stat().st_size > 0
    assert '"label_value": "agent"' in (agent / "review_sft" / "README.md").read_text()


def test_continuations_are_cached_and_settings_cannot_be_mixed(run: Path, tmp_path: Path) -> None:
    cfg = BuildConfig(rollouts=[str(run)], out=str(tmp_path), label_value="agent", value_rollouts=1)
    build(cfg)
    cached = (tmp_path / "agent_values.jsonl").read_text()
    (tmp_path / "labels.jsonl").unlink()  # relabel: every continuation comes from the cache
    (tmp_path / "labels.json").unlink()
    build(cfg)
    assert (tmp_path / "agent_values.jsonl").read_text() == cached
    with pytest.raises(UserInputError, match="label_value agent -> expert"):
        build(BuildConfig(rollouts=[str(run)], out=str(tmp_path), label_value="expert"))


def test_agent_lesson_values_keep_a_recoverys_reflection_but_not_continuing(run: Path, tmp_path: Path) -> None:
    """The injected mistake recurs from the same state unless memory blames it: with the recovery's
    reflection kept, some recoveries win where the plain agent would repeat its mistake; continuing
    (v_now) is valued exactly as before."""
    plain, lesson = tmp_path / "plain", tmp_path / "lesson"
    build(BuildConfig(rollouts=[str(run)], out=str(plain), bisect=False, label_value="agent", value_rollouts=1))
    name = f"{run.name}=agent-lesson"
    build(BuildConfig(rollouts=[str(run)], out=str(lesson), bisect=False, run_label_values=[name], value_rollouts=1))
    by_plain, by_lesson = labels(plain), labels(lesson)
    assert set(by_plain) == set(by_lesson)
    assert all(by_lesson[p]["v_now"] == by_plain[p]["v_now"] for p in by_plain)
    gains = [by_lesson[p]["values"][i] - v for p in by_plain for i, v in by_plain[p]["values"].items()]
    assert any(g > 0 for g in gains)
    recover = [sum(rows[p]["review"] == "recover" for p in rows) for rows in (by_plain, by_lesson)]
    assert recover[1] > recover[0]
    assert f'"run_label_values": ["{name}"]' in (lesson / "review_sft" / "README.md").read_text()


def test_run_label_values_must_name_a_known_value() -> None:
    assert BuildConfig(rollouts=["runs/a"], run_label_values=["a=agent"]).label_value_of("runs/a") == "agent"
    assert BuildConfig(rollouts=["runs/b"], run_label_values=["a=agent"]).label_value_of("runs/b") == "expert"
    with pytest.raises(ValueError, match="'agent-memory' is not one of expert, agent, agent-lesson"):
        BuildConfig(rollouts=["runs/a"], run_label_values=["a=agent-memory"])
    with pytest.raises(ValueError, match="are not FOLDER_NAME=VALUE"):
        BuildConfig(rollouts=["runs/a"], run_label_values=["agent"])


def test_each_rollout_folder_values_its_own_agent(run: Path, tmp_path: Path) -> None:
    """Two suites may run one policy name with one seed (the shipped agent generating on ScienceWorld,
    ranking on TextWorld): each folder's episodes are continued by an agent of that folder's run."""
    from data_gen.build import load_runs
    from data_gen.labelling import episodes_to_label
    from data_gen.points import decision_points

    twin = tmp_path / "rollout-twin"  # the same policy, error rate and seeds; another budget, so other episodes
    rollout(
        RolloutConfig(
            env="builtin", tasks=["workshop-3"], variations="0-5", error_rate=0.3, budget_agent="30", out=str(twin)
        )
    )
    cfg = BuildConfig(rollouts=[str(run), str(twin)], label_value="agent")
    episodes = load_runs(cfg.rollouts)
    points = [decision_points(record, source) for record, source in episodes]
    todo = episodes_to_label(episodes, points, {}, cfg)
    assert {Path(item.source).name for item in todo} == {run.name, twin.name}
    assert all(item.value_source and Path(item.value_source[1]).name == Path(item.source).name for item in todo)


def test_review_ties_take_the_heuristics_decision_where_the_values_say_nothing(run: Path, tmp_path: Path) -> None:
    """Same values, same evidence-bearing labels; where recovering and continuing are valued alike the
    label is the rule controller's decision instead of "continue". The labels record the setting."""
    from data_gen.build import load_runs
    from data_gen.hindsight import RECOVER_MARGIN, context_for
    from data_gen.points import decision_points
    from rir_runtime.controllers import HeuristicController

    plain, prior = tmp_path / "continue", tmp_path / "heuristic"
    build(BuildConfig(rollouts=[str(run)], out=str(plain), label_value="agent", value_rollouts=1))
    prior.mkdir()
    (prior / "agent_values.jsonl").write_text((plain / "agent_values.jsonl").read_text())  # the same continuations
    build(
        BuildConfig(rollouts=[str(run)], out=str(prior), label_value="agent", value_rollouts=1, review_ties="heuristic")
    )
    by_plain, by_prior = labels(plain), labels(prior)
    assert set(by_plain) == set(by_prior)
    heuristic = {
        p.id: HeuristicController().review(context_for(p)).value.decision
        for record, source in load_runs([str(run)])
        for p in decision_points(record, source)
    }
    changed = 0
    for pid, label in by_plain.items():
        assert by_prior[pid]["values"] == label["values"] and by_prior[pid]["v_now"] == label["v_now"]
        best = max(label["values"].values(), default=0.0)
        if abs(best - label["v_now"]) < RECOVER_MARGIN:
            assert label["review"] == "continue" and by_prior[pid]["review"] == heuristic[pid]
        else:
            assert by_prior[pid]["review"] == label["review"]
        changed += by_prior[pid]["review"] != label["review"]
    assert changed > 0  # the rollouts hold reviews where the values tie and the heuristic recovers
    assert '"review_ties": "heuristic"' in (prior / "review_sft" / "README.md").read_text()
    with pytest.raises(UserInputError, match="review_ties continue -> heuristic"):
        build(BuildConfig(rollouts=[str(run)], out=str(plain), label_value="agent", review_ties="heuristic"))
    with pytest.raises(ValueError, match="review_ties 'rules' is not one of continue, heuristic"):
        BuildConfig(rollouts=[str(run)], review_ties="rules")
