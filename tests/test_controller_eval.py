"""Offline scoring picks the rows it is asked for: by rollout source, spread over the split."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset, DatasetDict

from data_gen.scoring.metrics import gain_calibration
from eval.controller_eval import markdown, realised_gain, restore_quality, scored_rows, step_reference
from eval.pipeline import PipelineConfig, Suite, offline_verdict, row_groups


def write_review_rows(data: Path, sources: list[str]) -> None:
    rows = [
        {"prompt": f"p{i}", "meta": {"context": "{}", "source_run": f"runs/x/{src}", "index": i}}
        for i, src in enumerate(sources)
    ]
    DatasetDict({"validation": Dataset.from_list(rows)}).save_to_disk(str(data / "review_sft"))


def test_rows_keep_only_the_named_sources_and_spread_a_cap_over_them(tmp_path: Path) -> None:
    write_review_rows(tmp_path, ["rollout-expert"] * 6 + ["rollout-agent"] * 4)
    agent = scored_rows(tmp_path, "review_sft", "validation", 0, ["rollout-agent"])
    assert [r["meta"]["index"] for r in agent] == [6, 7, 8, 9]
    by_path = scored_rows(tmp_path, "review_sft", "validation", 0, ["runs/x/rollout-agent"])
    assert len(by_path) == 4
    spread = scored_rows(tmp_path, "review_sft", "validation", 3, [])
    assert [r["meta"]["index"] for r in spread] == [0, 3, 6]  # not the first three, all of one source
    assert scored_rows(tmp_path, "review_sft", "train", 3, []) == []


def test_a_capped_restore_point_sample_shares_the_cap_between_stay_and_step_back(tmp_path: Path) -> None:
    """2 stay points among 20: an evenly spaced cap of 8 would score at most one stay row; the
    stratified sample scores both, and the step-back rows fill the rest of the cap."""
    rows = [
        {
            "prompt": f"p{i}",
            "meta": {
                "context": "{}",
                "source_run": "r",
                "index": i,
                "decision": d,
                "label": "0",
                "step": 5,
                "restore": 5 if i in (4, 15) else 2,
            },
        }
        for i in range(20)
        for d in ("locate_coarse", "locate_fine")
    ]
    DatasetDict({"validation": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "locate_sft"))
    sample = scored_rows(tmp_path, "locate_sft", "validation", 8, [], stratify=True)
    stays = [(r["meta"]["decision"], r["meta"]["index"]) for r in sample if r["meta"]["restore"] == 5]
    assert sorted(stays) == [("locate_coarse", 4), ("locate_coarse", 15), ("locate_fine", 4), ("locate_fine", 15)]
    assert len(sample) == 8 and [r["meta"]["index"] for r in sample] == sorted(r["meta"]["index"] for r in sample)
    assert sum(r["meta"]["restore"] == 5 for r in scored_rows(tmp_path, "locate_sft", "validation", 8, [])) <= 2


def test_rows_of_the_agent_and_of_the_expert_are_scored_apart() -> None:
    cfg = PipelineConfig(
        suites=[
            Suite("builtin", ["workshop-3"], "0-9", ""),
            Suite("scienceworld", ["boil"], "0-3", "", name="sw-agent", policy="llm:agents/a"),
        ]
    )
    rollouts = {"builtin": Path("runs/p/rollout-builtin"), "sw-agent": Path("runs/p/rollout-sw-agent")}
    assert row_groups(cfg, rollouts) == {"expert": ["rollout-builtin"], "agent": ["rollout-sw-agent"]}
    one_kind = PipelineConfig(suites=[Suite("builtin", ["workshop-3"], "0-9", "")])
    assert row_groups(one_kind, {"builtin": Path("runs/p/rollout-builtin")}) == {"": []}


def test_the_offline_verdict_is_said_once_per_row_group(tmp_path: Path) -> None:
    for group, tuned_f1 in (("agent", 0.6), ("expert", 0.2)):
        results = [
            {"controller": "prompted:m", "review_f1": 0.4, "where_exact": 0.1},
            {"controller": "tuned:runs/p/sft", "review_f1": 0.0, "where_exact": 0.0},  # the DPO adapter's start
            {"controller": "tuned:runs/p/dpo", "review_f1": tuned_f1, "where_exact": 0.3},
        ]
        (tmp_path / group).mkdir()
        (tmp_path / group / "controller_eval.json").write_text(json.dumps({"results": results}))
    agent, expert = offline_verdict(tmp_path)
    assert "(agent rows), the tuned adapter beats its base model: review F1" in agent
    assert "(expert rows), the tuned adapter beats its base model on restore point exact, end to end" in expert
    assert "but not on review F1 (recover) 20.0% vs 40.0%" in expert


def test_restore_quality_scores_stay_and_step_back_rows_apart() -> None:
    # (pick, label, current checkpoint): two stay rows (one kept), two step-back rows (one exact)
    picks = [(5, 5, 5), (3, 7, 7), (2, 2, 6), (4, 3, 6)]
    q = restore_quality(picks)
    assert q["restore_exact"] == 0.5 and q["restore_within_one"] == 0.75
    assert (q["stay_rows"], q["stay_accuracy"]) == (2, 0.5)
    assert (q["back_rows"], q["back_exact"]) == (2, 0.5)
    assert restore_quality([(1, 2, 6)])["stay_accuracy"] is None  # no stay rows: no figure, not 0


def test_the_step_reference_ranks_reviews_by_how_late_they_come() -> None:
    """Late reviews recover, early ones continue: the step index alone ranks them perfectly, and the
    report says so beside the controllers' figures; reversed, it ranks them worst."""
    rows = [
        {"meta": {"label": label, "step": step, "env": "builtin"}}
        for label, step in (("continue", 2), ("continue", 4), ("recover", 9), ("recover", 12))
    ]
    reference = step_reference(rows)
    assert reference == {
        "review_rows": 4,
        "review_auroc_by_step": 1.0,
        "review_auroc_by_step_ci95": [1.0, 1.0],  # every resample with both answers ranks them perfectly
        "review_auroc_by_step_within_env": 1.0,
    }
    for row, step in zip(rows, (12, 9, 4, 2), strict=True):
        row["meta"]["step"] = step
    assert step_reference(rows)["review_auroc_by_step"] == 0.0
    text = markdown([{"controller": "heuristic", "review_auroc": 0.5}], "validation", None, reference)
    assert "ranking these 4 reviews by their step index alone gives AUROC 1.000 (1.000 within a benchmark)" in text
    assert "Reference" not in markdown([{"controller": "heuristic", "review_auroc": 0.5}], "validation")


def test_claimed_gains_are_set_against_the_gains_realised_in_hindsight() -> None:
    """A value controller claims its best recovery beats going on by its score difference; the row's
    value table says what that recovery was worth. Quarters of the claim, each with the realised mean."""
    meta = {"values": json.dumps({"3": 1.0, "4": 0.0}), "v_now": 0.0}
    assert realised_gain(meta, 3) == 1.0 and realised_gain(meta, 4) == 0.0
    assert realised_gain(meta, 7) is None and realised_gain(meta, None) is None  # no value, no checkpoint
    bins = gain_calibration([0.9, -1.0, 0.5, -0.2, 2.0, 1.5, -0.5, 0.1], [1, 0, 0, 0, 1, 1, -1, 0])
    assert [b["rows"] for b in bins] == [2, 2, 2, 2]
    assert [b["realised_mean"] for b in bins] == [-0.5, 0.0, 0.5, 1.0]  # calibrated: it rises with the claim
    assert bins[0]["claimed_min"] == -1.0 and bins[-1]["claimed_max"] == 2.0
    result = {"controller": "value:x", "review_gain_calibration": bins, "review_realised_gain_when_recovering": 0.75}
    text = markdown([result], "validation")
    assert "Claimed against realised gain, `value:x`" in text and "| +1.50 to +2.00 | 2 | +1.75 | +1.000 |" in text
    assert "mean realised gain is +0.750" in text
