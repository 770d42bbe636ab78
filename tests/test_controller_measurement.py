"""Offline controller measurement that can tell controllers apart: the Where scored end to end (coarse
segment, then a checkpoint in it, as the runtime serves it), bootstrap intervals, and versions checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from data_gen.scoring.metrics import auroc, binary_intervals, binary_quality, mean_ci
from eval import controller_eval
from eval.controller_eval import (
    ControllerEvalConfig,
    RestorePoint,
    check_versions,
    evaluate_controllers,
    markdown,
    score_controller,
    value_regret,
)
from rir_runtime.decisions import Decision
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UserInputError
from rir_runtime.prompts import DecisionContext, prompt_format_version

SEGMENTS = ((0, 3), (3, 7))  # two coarse segments over checkpoints 0..6
VALUES = {"0": 1.0, "1": 1.0, "2": 0.0, "6": 0.0}  # as bisection probes them: 3..5 are implied (0)


def context(
    steps: int, segments: tuple[tuple[int, int], ...], segment: tuple[int, int] | None = None
) -> DecisionContext:
    history = tuple(Step(i, f"act {i}", "ok", 0.0) for i in range(steps))
    return DecisionContext(
        "t", "goal", "", history, "ok", 0.0, "schedule", tuple(range(steps + 1)), segments=segments, segment=segment
    )


def locate_row(
    episode: str, decision: str, ctx: DecisionContext, label: int, restore: int, values: dict | None = None
) -> dict[str, Any]:
    meta = {
        "env": "builtin",
        "episode_id": episode,
        "step": len(ctx.history),
        "source_run": "runs/x/rollout-builtin",
        "decision": decision,
        "label": str(label),
        "restore": restore,
        "context": ctx.to_json(),
        "values": json.dumps(values if values is not None else VALUES),
        "v_now": 0.0,
    }
    return {
        "prompt": [{"role": "user", "content": decision}],
        "completion": [{"role": "assistant", "content": "{}"}],
    } | {"meta": meta}


def two_segment_point(episode: str = "e1") -> list[dict[str, Any]]:
    """A point whose label (checkpoint 1) lies in segment 0 of two: a coarse row and a fine row."""
    coarse = context(6, SEGMENTS)
    return [
        locate_row(episode, "locate_coarse", coarse, 0, 1),
        locate_row(episode, "locate_fine", replace(coarse, segment=SEGMENTS[0]), 1, 1),
    ]


def save_locate(data: Path, rows: list[dict[str, Any]]) -> Path:
    DatasetDict({"validation": Dataset.from_list(rows)}).save_to_disk(str(data / "locate_sft"))
    return data


class Picks:
    """A stand-in controller: a fixed coarse segment, and inside a segment its first checkpoint plus
    `offset` (or a fixed checkpoint); it counts its calls."""

    def __init__(self, segment: int, offset: int = 1, fixed: int | None = None) -> None:
        self.segment, self.offset, self.fixed = segment, offset, fixed
        self.calls: list[str] = []

    def locate_coarse(self, ctx: DecisionContext) -> Decision:
        self.calls.append("coarse")
        return Decision("locate_coarse", self.segment)

    def locate_fine(self, ctx: DecisionContext) -> Decision:
        self.calls.append("fine")
        assert ctx.segment is not None  # the runtime always asks inside a segment
        return Decision("locate_fine", self.fixed if self.fixed is not None else ctx.segment[0] + self.offset)

    review = reflect = None


def score(data: Path, controller: Picks, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(controller_eval, "make_controller", lambda _spec, _backend: controller)
    return score_controller("stand-in", data, "validation", 0, 0, [], weights={})


def test_a_missed_gold_segment_is_wrong_end_to_end_though_right_given_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller picks checkpoint 1 inside segment 0 (the label), but picks segment 1 first:
    scored on the fine row alone (given the gold segment) it is exact, served end to end it restores
    to checkpoint 4, past the harmful step, and gives up the value 1 the label keeps."""
    data = save_locate(tmp_path, two_segment_point())
    m = score(data, Picks(segment=1), monkeypatch)
    assert m["restore_exact"] == 1.0 and m["coarse_accuracy"] == 0.0  # the old, within-segment figure
    assert m["where_points"] == 1 and m["where_exact"] == 0.0 and m["where_within_one"] == 0.0
    assert m["where_value_regret"] == 1.0  # V(1) = 1; V(4) is implied by the next probed checkpoint, 6: 0
    assert (m["where_back_rows"], m["where_back_exact"], m["where_stay_accuracy"]) == (1, 0.0, None)
    right = score(data, Picks(segment=0), monkeypatch)
    assert right["where_exact"] == right["restore_exact"] == 1.0 and right["where_value_regret"] == 0.0
    text = markdown([m, right], "validation")
    assert text.index("restore point exact, end to end") < text.index("restore point exact, given the gold segment")


def test_a_single_segment_point_skips_the_coarse_question_and_a_bad_pick_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A branch of one segment has only a fine row: the runtime asks no coarse question there. A
    checkpoint that is not admissible falls back to the latest admissible one inside the segment."""
    ctx = context(3, ((0, 4),), (0, 4))
    ctx = replace(ctx, admissible=(0, 1, 2))  # an ended branch does not offer the current checkpoint
    data = save_locate(tmp_path, [locate_row("e2", "locate_fine", ctx, 2, 2, {"0": 1.0, "2": 1.0, "3": 0.0})])
    controller = Picks(segment=0, fixed=3)  # 3 is not admissible: the runtime restores to 2
    m = score(data, controller, monkeypatch)
    assert "coarse" not in controller.calls
    assert m["where_points"] == 1 and m["where_exact"] == 1.0 and m["where_value_regret"] == 0.0
    assert m["where_always_stay_exact"] == 1.0  # the latest admissible checkpoint is the label here


def test_points_come_one_per_recovery_and_always_staying_is_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two recoveries, four rows: two points. Always staying (the latest admissible checkpoint, 6)
    is exact on neither; the reference says so beside the controllers."""
    data = save_locate(tmp_path, two_segment_point("e1") + two_segment_point("e3"))
    m = score(data, Picks(segment=0), monkeypatch)
    assert m["where_points"] == 2 and m["where_exact"] == 1.0 and m["where_exact_ci95"] == [1.0, 1.0]
    assert m["where_always_stay_exact"] == 0.0 and m["where_always_stay_value_regret"] == 1.0
    assert m["coarse_accuracy_ci95"] == [1.0, 1.0]
    assert "of always staying (the bar) | 0.0% [0%, 0%] |" in markdown([m], "validation")


def test_value_regret_is_zero_for_the_oracle_pick_and_reads_implied_values() -> None:
    point = RestorePoint(context(6, SEGMENTS), 1, 6, {int(k): v for k, v in VALUES.items()})
    best = max(range(7), key=lambda i: (1.0 if i <= 1 else 0.0, i))  # the latest checkpoint of the best V
    assert best == point.restore and value_regret(point, best) == 0.0
    assert value_regret(point, 0) == 0.0  # as good, if earlier
    assert value_regret(point, 4) == 1.0 and value_regret(point, 6) == 1.0
    assert value_regret(replace(point, measured={}), 4) is None  # a row built without values


def test_bootstrap_intervals_hold_the_estimate_and_shrink_with_more_rows() -> None:
    rng = np.random.default_rng(1)
    widths = []
    for n in (40, 400):
        labels = [bool(i % 4 == 0) for i in range(n)]  # a quarter "recover", as review sets run
        scores = [float(y) + rng.normal(0, 0.8) for y in labels]
        predictions = [s > 0.5 for s in scores]
        q = binary_quality(labels, predictions, scores)
        ci = binary_intervals(labels, predictions, scores)
        for key, value in (("balanced_accuracy", q.balanced_accuracy), ("f1", q.f1), ("auroc", q.auroc)):
            interval = ci[f"{key}_ci95"]
            assert interval is not None and value is not None and interval[0] <= value <= interval[1], key
        assert ci == binary_intervals(labels, predictions, scores)  # a fixed seed: the same interval again
        lo, hi = ci["auroc_ci95"] or (0.0, 0.0)
        widths.append(hi - lo)
        assert auroc(labels, scores) == q.auroc
    assert widths[1] < widths[0] / 2  # ten times the rows: about a third of the width
    hits = [1.0] * 30 + [0.0] * 10
    lo, hi = mean_ci(hits) or (0.0, 0.0)
    assert lo < 0.75 < hi and mean_ci([]) is None


# --- versions ---------------------------------------------------------------------------------------------
def versioned_data(tmp_path: Path, build: dict[str, Any]) -> Path:
    data = tmp_path / "data"
    rows = [{"prompt": "p", "meta": {"context": context(1, ()).to_json(), "label": "continue", "step": 1}}]
    DatasetDict({"validation": Dataset.from_list(rows)}).save_to_disk(str(data / "review_sft"))
    (data / "build.json").write_text(json.dumps(build))
    return data


def adapter(tmp_path: Path, **versions: int) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    card = {"kind": "controller", "base_model": "tiny-random-llama", "review_threshold": 0.0}
    card |= {"prompt_format_version": prompt_format_version("controller"), **versions}
    (folder / "rir_controller.json").write_text(json.dumps(card))
    return folder


def test_an_adapter_trained_on_other_label_versions_is_refused(tmp_path: Path) -> None:
    current = prompt_format_version("controller")
    data = versioned_data(tmp_path, {"config": {}, "label_version": 2, "prompt_format_version": current})
    stale = adapter(tmp_path, data_label_version=1, data_prompt_format_version=current)
    cfg = ControllerEvalConfig(data=str(data), controller=[f"gated:tuned:{stale}"], out=str(tmp_path / "out"))
    with pytest.raises(UserInputError) as err:
        evaluate_controllers(cfg)
    message = str(err.value)
    assert f"{stale} was trained on data of label version 1 and controller prompt format version {current}" in message
    assert f"{data} holds label version 2 and controller prompt format version {current}" in message
    assert "`rir build-data`" in message and "retrain the adapter" in message
    assert not (tmp_path / "out").exists()  # refused before anything is scored
    adapter(tmp_path, data_label_version=2, data_prompt_format_version=current)
    check_versions(data, [f"tuned:{stale}", "heuristic"])  # the same versions: scored


def test_folders_written_before_the_versions_warn_once_and_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = versioned_data(tmp_path, {"config": {}})  # an old build.json
    old = adapter(tmp_path)  # an old card
    for _ in range(2):
        check_versions(data, [f"tuned:{old}"])
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "record no label or prompt format version" in err
    check_versions(data, ["heuristic"])  # no adapter: nothing to check, nothing said
    assert capsys.readouterr().err == ""


def test_the_adapter_card_keeps_the_versions_of_its_training_data(tmp_path: Path) -> None:
    import types

    from train.common.adapter_files import write_adapter_files
    from train.common.args import TrainScriptArguments

    data = versioned_data(
        tmp_path, {"config": {"max_prompt_tokens": 256}, "label_version": 2, "prompt_format_version": 7}
    )
    card = {"base_model": "tiny-random-llama", "base_model_path": "", "fingerprints": {}, "stage": "sft"}
    script = TrainScriptArguments(data=str(data), calibrate_review=False)
    training = types.SimpleNamespace(to_dict=lambda: {})
    out = tmp_path / "adapter"
    out.mkdir()
    write_adapter_files(str(out), {**card, "decision_types": ["locate"]}, script, training, script)
    written = json.loads((out / "rir_controller.json").read_text())
    assert (written["data_label_version"], written["data_prompt_format_version"]) == (2, 7)
    assert written["max_prompt_tokens"] == 256


# --- on data that `rir build-data` wrote ------------------------------------------------------------------
def test_eval_controller_scores_the_built_data_end_to_end_with_intervals(tmp_path: Path) -> None:
    from data_gen.build import build
    from data_gen.build_config import BuildConfig
    from data_gen.hindsight import LABEL_VERSION
    from data_gen.rollout import RolloutConfig, rollout

    runs = tmp_path / "rollout"
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-11", out=str(runs)))
    data = tmp_path / "data"
    build(BuildConfig(rollouts=[str(runs)], out=str(data)))
    built = json.loads((data / "build.json").read_text())
    assert built["label_version"] == LABEL_VERSION and built["prompt_format_version"] == prompt_format_version(
        "controller"
    )
    out = tmp_path / "eval"
    [m] = evaluate_controllers(ControllerEvalConfig(data=str(data), controller=["heuristic"], out=str(out)))
    record = json.loads((out / "controller_eval.json").read_text())
    assert m["where_points"] > 0 and 0.0 <= m["where_exact"] <= 1.0 and m["where_value_regret"] >= 0.0
    for key in ("where_exact", "coarse_accuracy", "review_balanced_accuracy", "review_f1"):
        ci = m[f"{key}_ci95"]  # None for a review figure where the few validation reviews hold one answer
        assert (ci is None and key.startswith("review")) or ci[0] <= m[key] <= ci[1], key
    reference = record["reference"]
    assert reference["where_points"] == m["where_points"]
    assert reference["where_always_stay_exact"] == m["where_always_stay_exact"]
    assert "review_auroc_by_step_ci95" in reference and "review_auroc_by_features_ci95" in reference
    text = (out / "controller_eval.md").read_text()
    assert text.index("end to end") < text.index("given the gold segment")
    assert "bootstrap 95% intervals" in text
