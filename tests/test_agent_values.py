"""Agent-relative hindsight values: the controlled agent's own chance from each checkpoint, cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_gen.build import BuildConfig, build
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
