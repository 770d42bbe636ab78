"""GRPO rewards on hand-built rows, the GRPO view's value tables against a linear scan, and the rewards
against the labels `rir build-data` writes (its hindsight answer must be the best-rewarded one)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from data_gen.scoring.answers import class_weights
from data_gen.scoring.rewards import (
    locate_reward,
    locate_score,
    offered_choices,
    restore_value,
    review_reward,
    review_score,
    review_verdict,
    view_row,
)
from rir_runtime.decisions import Review, dump
from rir_runtime.values import complete_values, latest_best_bisect, latest_best_linear

# checkpoints 0..4 of a branch whose harmful step is step 3: V is 1 up to checkpoint 3 exclusive
V = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
FINE = {i: [i] for i in V}


def fine(step: Any) -> str:
    return json.dumps({"step": step})


# --- review -------------------------------------------------------------------------------------
def test_review_rewards_agreement_only() -> None:
    right = dump("review", Review("recover", "the dish is ruined"))
    assert review_score(right, "recover", 2.5) == 2.5
    assert review_score(right, "continue", 2.5) == 0.0
    assert review_score('{"decision": "maybe"}', "recover") == 0.0
    assert review_score("recover", "recover") == 0.0  # no JSON: unparseable
    assert review_score("", "continue") == 0.0


def test_review_cut_inside_its_reason_still_states_its_decision() -> None:
    """max_completion_length cuts long reasons; the decision comes first and is what ranking scores."""
    assert review_verdict('{"decision": "recover", "reason": "the last action ru') == "recover"
    assert review_verdict('{"decision": "contin') is None
    assert review_verdict('{"reason": "x", "decision": "recover"') is None  # not the canonical order: unparseable


def test_class_weights_make_constant_answers_score_like_chance() -> None:
    """Inverse-frequency weights: on skewed labels, always answering either way earns half the
    perfect mean reward, and the mean reward is the balanced accuracy."""
    rng = random.Random(0)
    labels = ["continue"] * 45 + ["recover"] * 5
    w = class_weights(labels)

    def mean_reward(answers: list[str]) -> float:
        texts = [dump("review", Review(a, "")) for a in answers]  # type: ignore[arg-type]
        return sum(review_score(t, lab, w[lab]) for t, lab in zip(texts, labels, strict=True)) / len(labels)

    assert mean_reward(labels) == pytest.approx(1.0)
    assert mean_reward(["continue"] * 50) == pytest.approx(0.5)
    assert mean_reward(["recover"] * 50) == pytest.approx(0.5)
    answers = [rng.choice(["continue", "recover"]) for _ in labels]
    recall = {c: sum(a == lab == c for a, lab in zip(answers, labels, strict=True)) / labels.count(c) for c in w}
    assert mean_reward(answers) == pytest.approx((recall["continue"] + recall["recover"]) / 2)


# --- locate -------------------------------------------------------------------------------------
def test_locate_rewards_the_chosen_checkpoints_value() -> None:
    rewards = {i: locate_score("locate_fine", fine(i), V, FINE) for i in V}
    assert rewards[3] == rewards[4] == 0.0  # past the harmful step
    assert rewards[2] == 1.0  # the latest checkpoint of the best value
    assert 0 < rewards[0] < rewards[1] < rewards[2]  # equals ordered by progress kept
    assert rewards[0] == pytest.approx(0.5)  # the default lateness: half a value gap


def test_locate_zero_for_unoffered_or_unparseable_answers() -> None:
    assert locate_score("locate_fine", fine(7), V, FINE) == 0.0
    assert locate_score("locate_fine", fine(2), V, {3: [3], 4: [4]}) == 0.0  # outside the offered segment
    assert locate_score("locate_fine", fine("two"), V, FINE) == 0.0
    assert locate_score("locate_fine", "checkpoint 2", V, FINE) == 0.0
    assert locate_score("locate_fine", '{"segment": 2}', V, FINE) == 0.0  # wrong key for the decision


def test_a_higher_value_always_beats_a_later_lower_one() -> None:
    """With values that are not 0/1 the lateness penalty stays below the smallest value gap."""
    values = {0: 0.9, 1: 0.9, 2: 0.9, 3: 0.6, 4: 0.6, 5: 0.0}
    offered = list(values)
    for lateness in (0.0, 0.5, 0.99):
        r = [restore_value(i, values, offered, lateness) for i in offered]
        assert min(r[:3]) > max(r[3:5]) > r[5] == 0.0
        assert r[0] <= r[1] <= r[2] and r[3] <= r[4]


def test_coarse_answer_is_worth_the_best_checkpoint_of_its_segment() -> None:
    segments = {0: [0, 1], 1: [2, 3, 4], 2: []}
    rewards = {s: locate_score("locate_coarse", json.dumps({"segment": s}), V, segments) for s in segments}
    assert rewards[1] == 1.0  # holds checkpoint 2, the latest best
    assert 0 < rewards[0] < 1.0  # reaches the best value, further back
    assert rewards[2] == 0.0  # no checkpoint to restore to
    assert locate_score("locate_coarse", json.dumps({"segment": 3}), V, segments) == 0.0


def test_trl_reward_functions_answer_their_own_rows_only() -> None:
    """TRL passes the columns as lists and conversational completions as message lists."""
    msg = [{"role": "assistant", "content": fine(2)}]
    review = [{"role": "assistant", "content": dump("review", Review("continue", ""))}]
    rows = dict(
        completions=[msg, review, fine(0)],
        decision=["locate_fine", "review", "locate_fine"],
        label=["2", "continue", "2"],
        weight=[1.0, 3.0, 1.0],
        values=[json.dumps(V)] * 3,
        choices=[json.dumps(FINE)] * 3,
    )
    assert review_reward(**rows) == [None, 3.0, None]
    assert locate_reward(**rows) == [1.0, None, pytest.approx(0.5)]
    assert locate_reward(**rows, lateness=0.0) == [1.0, None, 1.0]


# --- the GRPO view: value tables and offered answers ---------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_bisection_implied_values_match_a_linear_scan(seed: int) -> None:
    """Where V only falls along a branch (0/1 values), the table completed from bisection's probes
    is the one a probe of every checkpoint measures."""
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    fall = rng.randint(0, n)
    truth = [1.0 if i < fall else 0.0 for i in range(n)]
    indices = list(range(n))
    restore, probed = latest_best_bisect(indices, lambda i: truth[i])
    assert restore == latest_best_linear(indices, lambda i: truth[i])[0]
    table = complete_values(probed, indices)
    assert table.values == dict(enumerate(truth))
    assert set(table.implied) == set(indices) - set(probed)


def test_unprobed_values_between_different_probes_take_the_lower_bound() -> None:
    table = complete_values({0: 1.0, 3: 0.5, 6: 0.0}, range(8))
    assert table.values == {0: 1.0, 1: 0.5, 2: 0.5, 3: 0.5, 4: 0.0, 5: 0.0, 6: 0.0, 7: 0.0}
    assert table.implied == (1, 2, 4, 5, 7)


def test_offered_choices_are_the_prompts_closed_answer_set() -> None:
    ctx = {"admissible": [0, 1, 2, 3, 4], "segments": [[0, 2], [2, 5]], "segment": [2, 5]}
    assert offered_choices("locate_fine", ctx) == {2: [2], 3: [3], 4: [4]}
    assert offered_choices("locate_coarse", ctx) == {0: [0, 1], 1: [2, 3, 4]}
    assert offered_choices("review", ctx) == {}


# --- against the builder's labels --------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real rollout of the error-injected expert on the workshop, labelled with bisection."""
    from data_gen.build import build
    from data_gen.build_config import BuildConfig
    from data_gen.rollout import RolloutConfig, rollout

    run = tmp_path_factory.mktemp("rollout")
    rollout(RolloutConfig(out=str(run), env="builtin", tasks=["workshop-3"], variations="0-7", error_rate=0.3))
    out = tmp_path_factory.mktemp("data")
    build(BuildConfig(rollouts=[str(run)], out=str(out)))
    return out


def _rows(data: Path, name: str) -> list[dict[str, Any]]:
    from datasets import load_from_disk

    dd = load_from_disk(str(data / name))
    return [row for split in dd for row in dd[split]]


def test_the_builders_locate_label_is_the_best_rewarded_answer(built: Path) -> None:
    rows = [view_row(r, {}) for r in _rows(built, "locate_sft")]
    assert {r["decision"] for r in rows} == {"locate_coarse", "locate_fine"}
    assert any(r["values_implied"] for r in rows)  # bisection left checkpoints unprobed
    for row in rows:
        key = "segment" if row["decision"] == "locate_coarse" else "step"
        rewards = {
            int(a): locate_reward([json.dumps({key: int(a)})], **_cols(row))[0] for a in json.loads(row["choices"])
        }
        label = int(row["label"])
        assert rewards[label] == max(rewards.values()) == row["best_value"] > 0, row
        assert sorted(rewards.values()).count(rewards[label]) == 1  # the label alone, ties broken by lateness


def test_the_builders_review_label_earns_its_class_weight(built: Path) -> None:
    raw = _rows(built, "review_sft")
    weights = class_weights([r["meta"]["label"] for r in raw])
    assert set(weights) == {"recover", "continue"}
    for r in raw:
        row = view_row(r, weights)
        label = row["label"]
        other = "continue" if label == "recover" else "recover"
        assert review_reward([r["completion"]], **_cols(row)) == [weights[label]]
        assert review_reward([dump("review", Review(other, ""))], **_cols(row)) == [0.0]  # type: ignore[arg-type]
        assert (row["best_value"] - row["v_now"] >= 0.5) == (label == "recover")


def _cols(row: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [v] for k, v in row.items() if k != "prompt"}


# --- scoring controllers with the reward ------------------------------------------------------------
def test_eval_controller_scores_each_controllers_reward(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the offline table, a controller that answers every row's hindsight label earns each row's
    best reward; the heuristic earns at most that, on the same rows."""
    from datasets import load_from_disk

    from eval import controller_eval
    from rir_runtime.decisions import Decision

    labels = {r["meta"]["context"] + r["meta"]["decision"]: r["meta"]["label"] for r in _rows(built, "review_sft")} | {
        r["meta"]["context"] + r["meta"]["decision"]: r["meta"]["label"] for r in _rows(built, "locate_sft")
    }

    class Hindsight:
        def _answer(self, kind: str, ctx: Any) -> Decision:
            label = labels[ctx.to_json() + kind]
            return Decision(kind, Review(label, "") if kind == "review" else int(label))  # type: ignore[arg-type]

        def review(self, ctx: Any) -> Decision:
            return self._answer("review", ctx)

        def locate_coarse(self, ctx: Any) -> Decision:
            return self._answer("locate_coarse", ctx)

        def locate_fine(self, ctx: Any) -> Decision:
            return self._answer("locate_fine", ctx)

        reflect = None

    real = controller_eval.make_controller
    monkeypatch.setattr(controller_eval, "make_controller", lambda s, b: Hindsight() if s == "label" else real(s, b))
    best, heuristic = (
        controller_eval.score_controller(s, built, "validation", 10_000, 0) for s in ("label", "heuristic")
    )
    val = {n: load_from_disk(str(built / n))["validation"] for n in ("review_sft", "locate_sft")}
    weights = class_weights([r["meta"]["label"] for r in load_from_disk(str(built / "review_sft"))["train"]])
    views = [view_row(r, weights) for ds in val.values() for r in ds]
    review_weights = [v["weight"] for v in views if v["decision"] == "review"]
    assert best["review_reward"] == pytest.approx(sum(review_weights) / len(review_weights))
    locate_best = [v["best_value"] for v in views if v["decision"] != "review"]
    assert best["locate_reward"] == pytest.approx(sum(locate_best) / len(locate_best))
    for key in ("review_reward", "locate_reward", "mean_reward"):
        assert 0.0 <= heuristic[key] <= best[key] + 1e-9, key
    assert "GRPO reward: mean" in controller_eval.markdown([best, heuristic], "validation")
    assert best["restore_exact"] == 1.0 and best["stay_rows"] + best["back_rows"] == best["fine_rows"]
    fine = [r for r in val["locate_sft"] if r["meta"]["decision"] == "locate_fine"]
    stays = [r for r in fine if int(r["meta"]["label"]) == len(json.loads(r["meta"]["context"])["history"])]
    assert (best["stay_rows"], best["back_rows"]) == (len(stays), len(fine) - len(stays))
    assert best["stay_accuracy"] == (1.0 if stays else None) and best["back_exact"] == 1.0


def test_reward_curve_reads_the_runs_trainer_state(tmp_path: Path) -> None:
    from rir_runtime.errors import UserInputError
    from train.reward_eval import main, reward_curve

    logs = [{"step": 1, "reward": 0.25, "loss": 0.0}, {"step": 2, "reward": 0.5}, {"step": 2, "train_runtime": 3.0}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": logs}))
    assert reward_curve(str(tmp_path)) == [(1, 0.25), (2, 0.5)]
    with pytest.raises(UserInputError, match="does not exist: pass the output folder"):
        reward_curve(str(tmp_path / "nothing"))
    with pytest.raises(UserInputError, match="pass --curve"):
        main([])
