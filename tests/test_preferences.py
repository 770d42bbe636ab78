"""Preference datasets against ground truth: every pair's chosen answer is the hindsight-better one.

Data is built from a real rollout of the error-injected expert on the built-in workshop, then each
pair is re-measured here without the builder: a fresh `ValueProbe` for review and locate pairs,
the reflection retries for reflect pairs, and the workshop's own knowledge of ruined ingredients
for where the harmful step is. The splits are checked across all datasets at once, as training
mixes them.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from data_gen import splits as builder
from data_gen.build import PREF, SFT, build, load_runs
from data_gen.build_config import BuildConfig
from data_gen.hindsight import Label, retry_success
from data_gen.points import decision_points
from data_gen.rollout import RolloutConfig, rollout
from data_gen.scoring.answers import answer_class
from data_gen.splits import variation_key
from rir_runtime.controllers import failure_signal
from rir_runtime.decisions import avoid_lesson, parse
from rir_runtime.envs import Snapshot, TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.prompts import DecisionContext
from rir_runtime.values import ValueProbe

# V is 0 or 1 on the workshop, so any margin in (0, 1] gives the same review label.
MARGIN = 0.5
NO_SIGNAL = "no visible failure signal"  # the review reason where the prompt shows no failure
# An error rate at which the reflection retries tell candidates apart in a few task variations.
ROLLOUT = {"env": "builtin", "tasks": ["workshop-3"], "variations": "0-11", "error_rate": 0.3}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, BuildConfig]:
    """(rollout folder, data folder, build config) of one small real rollout."""
    run = tmp_path_factory.mktemp("pref-rollout")
    rollout(RolloutConfig(out=str(run), **ROLLOUT))
    cfg = BuildConfig(rollouts=[str(run)], out=str(tmp_path_factory.mktemp("pref-data")))
    build(cfg)
    return run, Path(cfg.out), cfg


def rows(data: Path, name: str) -> list[dict[str, Any]]:
    """Every row of a dataset, validation included."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(data / name))
    return [row for split in dataset for row in dataset[split]]


def text(answer: list[dict[str, str]]) -> str:
    assert len(answer) == 1 and answer[0]["role"] == "assistant"
    return answer[0]["content"]


# --- independent measurement ------------------------------------------------------------------------
class Branch:
    """The row's branch re-executed on a fresh workshop: its checkpoints, their V, the harmful step."""

    def __init__(self, env: WorkshopEnv, meta: dict[str, Any]) -> None:
        self.env, self.ctx = env, DecisionContext.from_json(meta["context"])
        self.task = TaskSpec(meta["env"], meta["task"], meta["split"], int(meta["variation"]))
        env.reset(self.task)
        self.snaps: list[Snapshot] = [env.checkpoint()]
        self.fatal: int | None = None  # ground truth: the first step that ruins the workshop or loses
        for step in self.ctx.history:
            result = env.step(step.action)
            assert result.observation == step.observation, "the row's history does not replay"
            if self.fatal is None and (env.ruined_ingredients() or result.lost):
                self.fatal = step.index
            self.snaps.append(env.checkpoint())

    def value(self, i: int) -> float:
        return ValueProbe(self.env).value(self.snaps[i])

    def v_now(self) -> float:
        h = self.ctx.history
        if h and (h[-1].won or h[-1].lost):
            return 1.0 if h[-1].won else 0.0
        return self.value(len(h))


def supported_review(branch: Branch) -> str:
    """Recover iff some admissible checkpoint's V exceeds V(now) by the margin (a linear scan)."""
    best = max(branch.value(i) for i in branch.ctx.admissible)
    return "recover" if best - branch.v_now() >= MARGIN else "continue"


def offered(ctx: DecisionContext, kind: str) -> dict[int, list[int]]:
    """The answers a locate prompt offers, each with the checkpoints it restores to."""
    if kind == "locate_coarse":
        return {i: [c for c in ctx.admissible if a <= c < b] for i, (a, b) in enumerate(ctx.segments)}
    a, b = ctx.segment
    return {c: [c] for c in ctx.admissible if a <= c < b}


# --- review --------------------------------------------------------------------------------------------
def test_review_chosen_is_the_decision_a_fresh_value_probe_supports(built) -> None:
    _, data, _ = built
    env = WorkshopEnv()
    seen = set()
    for row in rows(data, "review_pref"):
        branch = Branch(env, row["meta"])
        chosen, rejected = parse("review", text(row["chosen"])), parse("review", text(row["rejected"]))
        truth = supported_review(branch)
        assert chosen.decision == truth != rejected.decision, row["meta"]["episode_id"]
        # the error-injected expert's ground truth agrees: recover iff an injected error doomed the branch
        doomed = branch.fatal is not None and branch.ctx.history[branch.fatal].injected_error
        assert (truth == "recover") == doomed, row["meta"]["episode_id"]
        seen.add(truth)
    assert seen == {"recover", "continue"}


def test_review_and_locate_rows_carry_the_measured_values(built) -> None:
    """`meta.values` (checkpoint -> V) and `meta.v_now` match a fresh probe, and the chosen answer
    follows from them, so a reward function can score answers without re-executing branches."""
    _, data, _ = built
    env = WorkshopEnv()
    for name in ("review_pref", "locate_pref"):
        for row in rows(data, name):
            branch = Branch(env, row["meta"])
            values = {int(k): v for k, v in json.loads(row["meta"]["values"]).items()}
            assert values and all(branch.value(i) == v for i, v in values.items()), name
            assert row["meta"]["v_now"] == branch.v_now(), name
            if name == "review_pref":
                best = max(v for i, v in values.items() if i in branch.ctx.admissible)
                recover = best - row["meta"]["v_now"] >= MARGIN
                assert parse("review", text(row["chosen"])).recover == recover
            else:  # the latest checkpoint of maximal V is (in) the chosen answer
                best = max(i for i, v in values.items() if v == max(values.values()))
                kind = row["meta"]["decision"]
                assert best in offered(branch.ctx, kind)[parse(kind, text(row["chosen"]))]


def test_review_pairs_differ_only_in_the_decision(built) -> None:
    """Same reason on both sides, read off the prompt's visible evidence: nothing but the decision
    separates chosen from rejected, and no reason asserts what the prompt does not show."""
    _, data, _ = built
    for row in rows(data, "review_pref"):
        chosen, rejected = parse("review", text(row["chosen"])), parse("review", text(row["rejected"]))
        assert chosen.decision != rejected.decision
        assert chosen.reason == rejected.reason, (chosen, rejected)
        signal = failure_signal(DecisionContext.from_json(row["meta"]["context"]))
        assert chosen.reason == (signal.text if signal else NO_SIGNAL)
    sft = {json.dumps(r["prompt"]): text(r["completion"]) for r in rows(data, "review_sft")}
    for row in rows(data, "review_pref"):
        assert sft[json.dumps(row["prompt"])] == text(row["chosen"])


def test_no_review_answer_has_an_empty_reason(built) -> None:
    _, data, _ = built
    answers = [text(r["completion"]) for r in rows(data, "review_sft")]
    answers += [text(r[side]) for r in rows(data, "review_pref") for side in ("chosen", "rejected")]
    assert answers and all(parse("review", a).reason.strip() for a in answers)


# --- locate --------------------------------------------------------------------------------------------
def test_locate_chosen_keeps_more_value_than_rejected(built) -> None:
    """V(chosen) > V(rejected), or equal V and chosen later (keeps more progress); a segment's V is
    that of its best checkpoint. Both answers are among those the prompt offers. Against the
    workshop's ground truth: a ruined branch restores to (the segment of) the harmful step; an
    intact one, recovered by the rollout's controller, stays at the current checkpoint."""
    _, data, _ = built
    env = WorkshopEnv()
    kinds, outcomes = set(), set()
    for row in rows(data, "locate_pref"):
        branch, kind = Branch(env, row["meta"]), row["meta"]["decision"]
        c, w = parse(kind, text(row["chosen"])), parse(kind, text(row["rejected"]))
        answers = offered(branch.ctx, kind)
        assert c in answers and w in answers, (kind, c, w, answers)
        vc, vw = (max(branch.value(i) for i in answers[x]) for x in (c, w))
        assert vc > vw or (vc == vw and c > w), (row["meta"]["episode_id"], kind, c, vc, w, vw)
        if branch.fatal is None:  # nothing ruined: stay (the current checkpoint is in the answer)
            assert len(branch.ctx.history) in answers[c], (row["meta"]["episode_id"], kind, c)
            outcomes.add("stay")
            assert answer_class(row["meta"]) == "stay", row["meta"]["episode_id"]
        else:  # the harmful step is the injected error that ruined the workshop
            assert branch.fatal in answers[c] and branch.ctx.history[branch.fatal].injected_error
            outcomes.add("restore")
            assert answer_class(row["meta"]) == "step back", row["meta"]["episode_id"]
        kinds.add(kind)
    assert kinds == {"locate_coarse", "locate_fine"}
    assert outcomes == {"stay", "restore"}


# --- reflect -------------------------------------------------------------------------------------------
def _label(run: Path, env: WorkshopEnv, meta: dict[str, Any]) -> tuple[Label, float]:
    """The row's decision point rebuilt from the rollout (memory included), restore snapshot set."""
    record = next(r for r, _ in load_runs([str(run)]) if r.episode_id == meta["episode_id"])
    ctx = DecisionContext.from_json(meta["context"])
    point = next(p for p in decision_points(record) if p.history == ctx.history)
    branch = Branch(env, meta)
    r = ctx.restore_point
    assert r is not None
    label = Label(point, {}, 0.0, "recover", r, None, (), 0, 0, restore_snapshot=branch.snaps[r])
    return label, record.error_rate


def test_reflect_chosen_retries_at_least_as_well(built) -> None:
    """Retry success re-measured from the rollout's own decision point (same K retries and seeds)."""
    run, data, cfg = built
    env = WorkshopEnv()
    pairs = rows(data, "reflect_pref")
    assert pairs
    margins = []
    for row in pairs:
        label, rate = _label(run, env, row["meta"])
        chosen, rejected = parse("reflect", text(row["chosen"])), parse("reflect", text(row["rejected"]))
        assert chosen != rejected
        won = [retry_success(env, label, r, cfg.reflect_retries, rate) for r in (chosen, rejected)]
        margins.append(won[0] - won[1])
    assert min(margins) >= 0 and max(margins) > 0, margins


def test_every_trained_lesson_has_the_heuristics_wording(built) -> None:
    """The What is taught one wording, the one the heuristic's records use online (the agent's prompt
    shows the lesson; memory guidance acts on the record's action)."""
    _, data, _ = built
    failures = [parse("reflect", text(row["completion"])).failure for row in rows(data, "reflect_sft")]
    failures = [f for f in failures if f is not None]
    assert failures
    assert all(f.lesson == avoid_lesson(f.action) for f in failures), [f.lesson for f in failures][:3]


# --- splits --------------------------------------------------------------------------------------------
def test_every_dataset_with_two_variations_has_both_splits_and_none_is_shared(built) -> None:
    from datasets import load_from_disk

    _, data, _ = built
    sides: dict[str, set[str]] = defaultdict(set)
    for name in SFT + PREF:
        dataset = load_from_disk(str(data / name))
        keys = {s: {variation_key(m) for m in dataset[s]["meta"]} for s in dataset}
        if len(set().union(*keys.values())) >= 2:
            # review rows: the held-out variations split again, so calibration never reads a scored row
            expected = {"train", "validation", "calibration"} if name.startswith("review") else {"train", "validation"}
            assert set(dataset) == expected, name
            assert not keys.get("calibration", set()) & keys["validation"], name
        for split, found in keys.items():
            sides[split] |= found
    assert sides["train"] and sides["validation"] and sides["calibration"]
    assert not sides["train"] & (sides["validation"] | sides["calibration"])
    reflect = {variation_key(m) for s, d in load_from_disk(str(data / "reflect_pref")).items() for m in d["meta"]}
    assert len(reflect) >= 2  # the case the split must handle: few variations in a small dataset


def test_dataset_card_counts_variations_per_split(built) -> None:
    from datasets import load_from_disk

    _, data, _ = built
    datasets = {name: load_from_disk(str(data / name)) for name in SFT + PREF}
    sides = {
        s: {variation_key(m) for d in datasets.values() for split in d if split in held for m in d[split]["meta"]}
        for s, held in (("train", {"train"}), ("validation", {"validation", "calibration"}))
    }
    build_wide = (
        f"{len(sides['train'])} task variations on the train side, {len(sides['validation'])} on the validation"
    )
    for name, dataset in datasets.items():
        card = (data / name / "README.md").read_text()
        assert build_wide in " ".join(card.split()), name
        for split in dataset:
            n = len({variation_key(m) for m in dataset[split]["meta"]})
            assert f"| {split} | {dataset[split].num_rows} | {n} |" in card, name
        assert ("`calibration` split" in card) == ("calibration" in dataset), name


def test_held_out_set_gives_small_datasets_both_sides() -> None:
    """A dataset whose variations all fall on one side of the deterministic share gets one moved."""
    many = {f"builtin/workshop-3/train/{i}" for i in range(10)}
    start = builder.held_out_variations({"review": many}, 0.2)
    train_only = sorted(many - start)[:2]
    held_only = sorted(start)
    by_dataset = {"review": many, "reflect": set(train_only), "locate": set(held_only)}
    held = builder.held_out_variations(by_dataset, 0.2)
    for name, keys in by_dataset.items():
        if len(keys) >= 2:
            assert keys & held and keys - held, name
    # a dataset from one held-out variation goes to train: trainable, if not evaluable
    assert builder.held_out_variations({"review": many, "one": {held_only[0]}}, 0.2) == start - {held_only[0]}
    # nothing moves where no dataset needs it
    assert builder.held_out_variations({"review": many, "reflect": {*train_only[:1], *held_only[:1]}}, 0.2) == start


def test_calibration_takes_half_the_held_out_variations_and_needs_two() -> None:
    held = {f"builtin/workshop-3/train/{i}" for i in range(7)}
    calibration = builder.calibration_variations(held)
    assert calibration < held and len(calibration) == 3 and calibration == builder.calibration_variations(set(held))
    assert builder.calibration_variations({"builtin/workshop-3/train/0"}) == set()
    rows = [{"meta": {"env": "builtin", "task": "workshop-3", "split": "train", "variation": i}} for i in range(9)]
    splits = builder.split_rows(rows, held, calibration)
    assert [len(splits[s]) for s in ("train", "validation", "calibration")] == [2, 4, 3]
    assert set(builder.split_rows(rows, held)) == {"train", "validation"}  # other datasets: no calibration


def test_held_out_set_never_empties_a_side_to_fill_another() -> None:
    pool = {f"builtin/workshop-3/train/{i}" for i in range(6)}
    h0, h1, h2, h3 = sorted(builder.validation_variations(pool, 4 / 6))
    k1, k2 = sorted(pool - {h0, h1, h2, h3})
    # x has no validation side, and moving either of its variations would empty the train side of two others
    by_dataset = {"x": {k1, k2}, "y": {k1, h0}, "z": {k1, h1}, "w": {k2, h2}, "v": {k2, h3}}
    held = builder.held_out_variations(by_dataset, 4 / 6)
    assert all(keys & held and keys - held for name, keys in by_dataset.items() if name != "x")


# --- training ------------------------------------------------------------------------------------------
def test_dpo_trains_on_the_built_reflect_pref(built, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from test_train import FAST, REPO  # the training tests' fast CPU flags
    from test_train import parse as parse_train

    from train import dpo

    _, _, cfg = built
    # the byte tokenizer counts each character: bound the prompts in its tokens (labels are reused)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(Path(cfg.out) / "labels.jsonl", data / "labels.jsonl")
    build(replace(cfg, out=str(data), tokenizer="tiny-random-llama", max_prompt_tokens=1024))
    args = parse_train(
        "dpo",
        [
            "--config",
            str(REPO / "configs/train/dpo_cpu_quick.yaml"),
            *FAST,
            "--sft-adapter",
            "",
            "--data",
            str(data),
            "--decision_types",
            "reflect",
            "--output-dir",
            str(tmp_path / "dpo"),
            "--max-steps",
            "1",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "1",
            "--max_length",
            "2048",
            "--per_device_train_batch_size",
            "1",
            "--per_device_eval_batch_size",
            "2",
            "--max_eval_samples",
            "2",
        ],
    )
    trainer, _ = dpo.build_trainer(*args)
    trainer.train()
    logs = trainer.state.log_history
    assert trainer.state.global_step == 1
    assert any("loss" in e for e in logs) and any("eval_rewards/accuracies" in e for e in logs)
