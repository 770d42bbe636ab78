"""Decision quality on skewed labels: the metrics, class balancing, and the calibrated review threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_gen.scoring.metrics import auroc, auroc_within, best_threshold, binary_quality
from rir_runtime.controllers import PromptedController, make_controller
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UserInputError
from rir_runtime.prompts import DecisionContext, prompt_format_version, render_decision
from tests.factories import Margin
from tests.training import FAST, REPO, parse

CTX = DecisionContext("t", "goal", "", (Step(0, "look", "x", 0.0),), "x", 0.0, "schedule", (0, 1))


def test_binary_quality_on_known_counts() -> None:
    labels = [True] * 8 + [False] * 2
    always = binary_quality(labels, [True] * 10, [1.0] * 10)  # the majority answer every time
    assert always.accuracy == 0.8 and always.balanced_accuracy == 0.5 and always.auroc == 0.5
    assert always.majority_accuracy == 0.8 and always.f1 == pytest.approx(always.majority_f1)
    mixed = binary_quality(labels, [True] * 6 + [False] * 3 + [True], [0.9] * 6 + [0.1] * 3 + [0.6])
    assert (mixed.precision, mixed.recall) == (6 / 7, 6 / 8)
    assert mixed.balanced_accuracy == pytest.approx((6 / 8 + 1 / 2) / 2)


def test_auroc_and_the_best_threshold() -> None:
    labels = [True, True, False, False, True]
    assert auroc(labels, [3.0, 2.0, 1.0, 0.0, 5.0]) == 1.0
    assert auroc(labels, [0.0, 0.0, 1.0, 2.0, 0.5]) == 0.0
    assert auroc([True, True], [1.0, 2.0]) is None
    # a margin that orders rows perfectly but sits below zero: the best cut lies between the groups
    margins = [-8.0, -7.5, -9.5, -9.9, -7.0]
    cut = best_threshold(labels, margins)
    assert -9.5 < cut < -8.0
    assert binary_quality(labels, [m > cut for m in margins], margins).balanced_accuracy == 1.0


def test_auroc_within_a_benchmark_ignores_an_offset_between_benchmarks() -> None:
    """Scores that sit higher on one benchmark, where more rows are positive, buy pooled AUROC but
    not AUROC within each benchmark."""
    labels = [True, True, False, True, False, False]
    envs = ["tw", "tw", "tw", "sw", "sw", "sw"]
    scores = [1.0, 1.2, 1.5, -3.0, -2.0, -1.0]  # inside each benchmark every negative scores higher
    assert auroc(labels, scores) == 4 / 9
    assert auroc_within(labels, scores, envs) == 0.0
    scores[3] = 0.0  # now right on sw's two pairs
    assert auroc_within(labels, scores, envs) == 2 / 4
    assert auroc_within(labels, scores, ["tw"] * 3 + ["sw", "x", "y"]) == 0.0  # groups with one class count not
    assert auroc_within([True, False], [1.0, 0.0], ["a", "b"]) is None


@pytest.mark.parametrize(
    ("margin", "threshold", "recover"), [(-3.0, 0.0, False), (-3.0, -4.0, True), (1.0, 2.0, False)]
)
def test_a_ranked_review_compares_the_margin_to_the_threshold(margin: float, threshold: float, recover: bool) -> None:
    decision = PromptedController(Margin(margin), "m", review_threshold=threshold).review(CTX)  # type: ignore[arg-type]
    assert decision.value.recover is recover
    assert decision.meta["margin"] == margin and decision.meta["threshold"] == threshold


def test_balancing_evens_the_answer_classes_and_keeps_the_row_count() -> None:
    from datasets import Dataset

    from train.common.data import balance_labels

    rows = [{"x": i, "meta": {"decision": "review", "label": "recover" if i < 6 else "continue"}} for i in range(8)]
    out = balance_labels(Dataset.from_list(rows), seed=0, what="review_sft")
    labels = [m["label"] for m in out["meta"]]
    assert labels.count("recover") == labels.count("continue") == 4 and len(out) == 8
    assert set(out["x"]) >= {6, 7}  # every row of the rarer label kept
    unlabelled = Dataset.from_list([{"x": 1, "meta": {"step": 0}}])
    assert balance_labels(unlabelled, seed=0, what="x") is unlabelled


def test_decision_shares_resample_each_decision_to_its_share_of_the_rows() -> None:
    """20 review, 60 restore-point and 20 reflection rows at shares 0.6/0.3/0.1 become 60/30/10: the
    total stays 100, the review rows are repeated, the restore-point rows thinned."""
    from datasets import Dataset

    from train.common.args import TrainScriptArguments
    from train.common.data import mix_to_shares

    sizes = (("r", 20), ("l", 60), ("f", 20))
    parts = [Dataset.from_list([{"x": f"{name}{i}"} for i in range(n)]) for name, n in sizes]
    script = TrainScriptArguments(decision_shares=[6, 3, 1])  # normalised to 0.6/0.3/0.1
    out = mix_to_shares(parts, script.decision_shares, seed=0, names=["review", "locate", "reflect"])
    assert [len(ds) for ds in out] == [60, 30, 10]
    assert set(out[0]["x"]) == {f"r{i}" for i in range(20)}  # every review row kept, then repeated
    assert len(set(out[1]["x"])) == 30  # thinned without repeats
    with pytest.raises(UserInputError, match="one non-negative share per decision type"):
        TrainScriptArguments(decision_shares=[0.5, 0.5])
    alone = TrainScriptArguments(decision_types=["review"], decision_shares=[0.6, 0.3, 0.1])  # a config's mix
    assert alone.decision_shares is None  # one decision takes every row, so `--decision_types review` still works


def test_balancing_by_source_gives_a_small_rollout_folder_its_share_of_each_class() -> None:
    """30 "recover" rows from the workshop and 3 from the agent's own rollouts: balanced by label
    alone the agent's rows keep their 1-in-11 share of the class; by source they get half of it."""
    from collections import Counter

    from datasets import Dataset

    from train.common.data import balance_labels

    def row(i: int, label: str, source: str) -> dict:
        return {"x": i, "meta": {"decision": "review", "label": label, "source_run": source}}

    rows = [row(i, "recover", "runs/p/rollout-builtin") for i in range(30)]
    rows += [row(30 + i, "recover", "runs/p/rollout-agent") for i in range(3)]
    rows += [row(33 + i, "continue", "runs/p/rollout-builtin") for i in range(67)]
    plain = balance_labels(Dataset.from_list(rows), seed=0, what="review_sft")
    by_source = balance_labels(Dataset.from_list(rows), seed=0, what="review_sft", by_source=True)
    for out in (plain, by_source):
        assert len(out) == 100 and Counter(m["label"] for m in out["meta"]) == {"recover": 50, "continue": 50}
    pairs = zip(by_source["x"], by_source["meta"], strict=True)
    agent_rows = [x for x, m in pairs if m["source_run"].endswith("rollout-agent")]
    assert len(agent_rows) == 25 and set(agent_rows) == {30, 31, 32}  # half the class: its 3 rows repeated
    assert sum(m["source_run"].endswith("rollout-agent") for m in plain["meta"]) < 10


def test_restore_point_rows_are_balanced_between_staying_and_stepping_back() -> None:
    """One stay row in ten (the restore label is the current checkpoint, `meta.step`) becomes one in
    two, for the coarse and the fine rows alike."""
    from datasets import Dataset

    from data_gen.scoring.answers import answer_class
    from train.common.data import balance_labels

    def row(i: int, decision: str, restore: int) -> dict:
        label = str(restore) if decision == "locate_fine" else "0"
        return {"x": i, "meta": {"decision": decision, "label": label, "step": 5, "restore": restore}}

    rows = [row(i, d, 5 if i == 0 else 3) for i in range(10) for d in ("locate_coarse", "locate_fine")]
    assert [answer_class(r["meta"]) for r in rows[:4]] == ["stay", "stay", "step back", "step back"]
    out = balance_labels(Dataset.from_list(rows), seed=0, what="locate_sft")
    classes = [answer_class(m) for m in out["meta"]]
    assert classes.count("stay") == classes.count("step back") == 10 and len(out) == 20
    assert answer_class({"decision": "locate_fine", "label": "4", "step": 4}) == "stay"  # rows without meta.restore
    assert answer_class({"decision": "locate_coarse", "label": "1", "step": 4}) is None
    assert answer_class({"decision": "locate_fine", "label": "1"}) is None  # hand-made rows


def test_calibration_writes_the_threshold_that_tuned_controllers_use(tmp_path: Path) -> None:
    """A 1-step tiny adapter on review rows of both labels: the card gets a threshold and the
    controller built from `tuned:<dir>` decides with it."""
    from datasets import Dataset, DatasetDict

    from train import sft

    data = tmp_path / "data"
    for name in ("review_sft", "locate_sft", "reflect_sft"):
        rows = []
        for i in range(12):
            ctx = DecisionContext(
                "t", "goal", "", (Step(0, f"take item {i}", "ok", 0.0),), "ok", 0.0, "schedule", (0, 1)
            )
            label = "recover" if i % 3 == 0 else "continue"
            answer = json.dumps({"decision": label, "reason": "x"})
            meta = {"label": label, "context": ctx.to_json(), "decision": "review", "step": 1}
            prompt = render_decision("review", ctx)
            rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": answer}], "meta": meta})
        held = {"validation": Dataset.from_list(rows[6:8]), "calibration": Dataset.from_list(rows[8:])}
        DatasetDict({"train": Dataset.from_list(rows[:6]), **held}).save_to_disk(str(data / name))
    (data / "build.json").write_text(json.dumps({"config": {"max_prompt_tokens": 256}}))  # as `rir build-data`
    out = tmp_path / "adapter"
    argv = ["--config", str(REPO / "configs/train/sft_cpu_quick.yaml"), *FAST, "--data", str(data)]
    argv += ["--output_dir", str(out), "--max_steps", "1", "--decision_types", "review", "--eval_strategy", "no"]
    sft.main(*parse("sft", [*argv, "--calibration_min_per_label", "1"]))  # 4 calibration rows, 1 recover
    card = json.loads((out / "rir_controller.json").read_text())
    calibration = card["review_calibration"]
    assert calibration["split"] == "calibration"  # not the validation rows that offline scores read
    assert calibration["rows"] == 4 and calibration["recover_rows"] == 1 and "review_threshold" in card
    if "skipped" in calibration:  # a random tiny model may rank the 4 rows backwards: then no cut is fitted
        assert "no better than chance" in calibration["skipped"] and card["review_threshold"] == 0.0
    else:
        assert calibration["balanced_accuracy_at_threshold"] >= calibration["balanced_accuracy_at_0"]
    controller = make_controller(f"tuned:{out}")
    assert isinstance(controller, PromptedController) and controller.review_threshold == card["review_threshold"]
    assert controller.max_prompt_tokens == card["max_prompt_tokens"] == 256  # served within its training budget
    # a run killed while calibrating leaves the card's pending null: refused, with the way out
    (out / "rir_controller.json").write_text(json.dumps({**card, "review_threshold": None}))
    with pytest.raises(UserInputError, match="no calibrated review threshold.*rerun the same `rir train`"):
        make_controller(f"tuned:{out}")


def test_calibration_on_too_few_rows_of_a_label_keeps_threshold_zero_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two "recover" rows of nine fix no threshold: the card keeps 0 with the reason, and the adapter
    is not even loaded (the folder holds only a card)."""
    from datasets import Dataset, DatasetDict

    from train.common.calibrate import calibrate_review

    ctx = DecisionContext("t", "goal", "", (Step(0, "look", "ok", 0.0),), "ok", 0.0, "schedule", (0, 1))
    rows = [{"meta": {"label": "recover" if i < 2 else "continue", "context": ctx.to_json()}} for i in range(9)]
    DatasetDict({"calibration": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data" / "review_sft"))
    (tmp_path / "rir_controller.json").write_text(json.dumps({"kind": "controller", "review_threshold": None}))
    record = calibrate_review(str(tmp_path), str(tmp_path / "data"), min_per_label=5)
    card = json.loads((tmp_path / "rir_controller.json").read_text())
    assert card["review_threshold"] == record["review_threshold"] == 0.0
    assert card["review_calibration"]["rows"] == 9 and card["review_calibration"]["recover_rows"] == 2
    assert "fewer than 5 of a label" in card["review_calibration"]["skipped"]
    assert "calibration skipped" in capsys.readouterr().err
    with pytest.raises(UserInputError, match="format version"):  # enough rows: it loads the adapter to score them
        calibrate_review(str(tmp_path), str(tmp_path / "data"), min_per_label=2)
    one_label = [{**row, "meta": {**row["meta"], "label": "continue"}} for row in rows]
    DatasetDict({"calibration": Dataset.from_list(one_label)}).save_to_disk(str(tmp_path / "one" / "review_sft"))
    assert calibrate_review(str(tmp_path), str(tmp_path / "one"), min_per_label=0)["review_threshold"] == 0.0


def test_calibration_keeps_threshold_zero_when_the_margins_rank_no_better_than_chance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Margins that order the rows backwards (every "recover" row lowest) would set a cut at an
    extreme, an adapter that says one answer everywhere; the card keeps 0 and says why. So do margins
    a shade better than a coin (AUROC 0.583 on 12 rows, an interval far across 0.5). The same rows
    ranked the right way round do get a threshold."""
    from datasets import Dataset, DatasetDict

    import train.common.calibrate

    ctx = DecisionContext("t", "goal", "", (Step(0, "look", "ok", 0.0),), "ok", 0.0, "schedule", (0, 1))
    rows = [{"meta": {"label": "recover" if i < 6 else "continue", "context": ctx.to_json()}} for i in range(12)]
    DatasetDict({"calibration": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data" / "review_sft"))
    card_path = tmp_path / "rir_controller.json"
    backwards = [-9.0 + 0.1 * i for i in range(12)]  # rises with the row index: "continue" rows score higher
    barely = [2 * k + 0.5 for k in range(6)] + [2.0 * k for k in range(6)]  # recover row k beats k + 1 of 6
    for margins, fitted in ((backwards, False), (barely, False), (backwards[::-1], True)):
        card_path.write_text(json.dumps({"kind": "controller", "review_threshold": None}))
        monkeypatch.setattr(train.common.calibrate, "review_margins", lambda _dir, _metas, m=margins: m)
        record = train.common.calibrate.calibrate_review(str(tmp_path), str(tmp_path / "data"), min_per_label=5)
        card = json.loads(card_path.read_text())
        assert card["review_threshold"] == record["review_threshold"]
        if fitted:
            assert -8.5 < card["review_threshold"] < -8.2 and card["review_calibration"]["auroc"] == 1.0
        else:
            assert card["review_threshold"] == 0.0 and card["review_calibration"]["auroc"] in (0.0, 21 / 36)
            assert card["review_calibration"]["auroc_low"] <= 0.5
            assert "no better than chance" in card["review_calibration"]["skipped"]


def test_calibration_shares_its_row_cap_between_the_rollout_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows come in blocks by rollout folder: 30 workshop reviews, then 6 of the agent's. A cap of 12
    that took the first rows would fit the threshold on workshop rows alone; shared by folder, every
    one of the agent's rows is scored and the card says how many came from where."""
    from datasets import Dataset, DatasetDict

    import train.common.calibrate

    ctx = DecisionContext("t", "goal", "", (Step(0, "look", "ok", 0.0),), "ok", 0.0, "schedule", (0, 1))
    rows = [
        {"meta": {"label": "recover" if i % 3 == 0 else "continue", "context": ctx.to_json(), "source_run": run}}
        for i, run in enumerate(["runs/c/rollout-builtin"] * 30 + ["runs/c/rollout-agent"] * 6)
    ]
    DatasetDict({"calibration": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data" / "review_sft"))
    (tmp_path / "rir_controller.json").write_text(json.dumps({"kind": "controller", "review_threshold": None}))
    scored: list[list[str]] = []

    def margins(_dir: str, metas: list[dict]) -> list[float]:
        scored.append([m["source_run"] for m in metas])
        return [1.0 if m["label"] == "recover" else -1.0 for m in metas]

    monkeypatch.setattr(train.common.calibrate, "review_margins", margins)
    record = train.common.calibrate.calibrate_review(
        str(tmp_path), str(tmp_path / "data"), max_rows=12, min_per_label=2
    )
    assert scored[0].count("runs/c/rollout-agent") == 6 and len(scored[0]) == 12
    assert record["review_calibration"]["rows_by_source"] == {"rollout-builtin": 6, "rollout-agent": 6}


def test_the_card_holds_a_pending_threshold_until_calibration_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The card is written before calibration loads the adapter; a kill in between leaves `null`."""
    import types

    import train.common.calibrate
    from train.common.args import TrainScriptArguments
    from train.common.run import finish_adapter

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train.common.calibrate, "calibrate_review", killed)
    card = {"base_model": "tiny-random-llama", "base_model_path": "", "fingerprints": {}, "stage": "sft"}
    training = types.SimpleNamespace(to_dict=lambda: {})
    script = TrainScriptArguments(calibrate_review=True)
    with pytest.raises(KeyboardInterrupt):
        finish_adapter(str(tmp_path), {**card, "decision_types": ["review"]}, script, training, script)
    assert json.loads((tmp_path / "rir_controller.json").read_text())["review_threshold"] is None
    finish_adapter(str(tmp_path), {**card, "decision_types": ["locate"]}, script, training, script)
    assert "review_threshold" not in json.loads((tmp_path / "rir_controller.json").read_text())


def test_rir_train_calibrate_refits_the_card_of_an_existing_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rir train calibrate` writes the threshold into a trained adapter's card; a folder that is not
    a controller adapter is refused with what to pass instead."""
    from datasets import Dataset, DatasetDict

    import train.common.calibrate
    from rir_runtime.cli import main

    ctx = DecisionContext("t", "goal", "", (Step(0, "look", "ok", 0.0),), "ok", 0.0, "schedule", (0, 1))
    rows = [{"meta": {"label": "recover" if i < 6 else "continue", "context": ctx.to_json()}} for i in range(12)]
    DatasetDict({"calibration": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data" / "review_sft"))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    card = {"kind": "controller", "base_model": "tiny", "prompt_format_version": prompt_format_version("controller")}
    (adapter / "rir_controller.json").write_text(json.dumps(card | {"review_threshold": -6.0}))
    monkeypatch.setattr(
        train.common.calibrate, "review_margins", lambda _d, metas: [2.0 - i for i in range(len(metas))]
    )
    assert main(["train", "calibrate", "--adapter", str(adapter), "--data", str(tmp_path / "data")]) == 0
    card = json.loads((adapter / "rir_controller.json").read_text())
    assert -4.0 < card["review_threshold"] < -3.0 and card["review_calibration"]["rows"] == 12
    assert main(["train", "calibrate", "--adapter", str(tmp_path / "data"), "--data", str(tmp_path / "data")]) == 2
    assert "is not an adapter folder" in capsys.readouterr().err
    (adapter / "rir_controller.json").write_text(json.dumps(card | {"kind": "agent"}))  # an agent's card
    assert main(["train", "calibrate", "--adapter", str(adapter), "--data", str(tmp_path / "data")]) == 2
    assert "is an agent adapter, not a controller adapter" in capsys.readouterr().err
