"""`rir eval-controller`: offline decision quality of controllers on held-out labelled datasets.

    rir eval-controller --data data/controller --controller heuristic,prompted:smollm2-135m-instruct,tuned:adapters/sft

Each row of the `*_sft` datasets keeps the `DecisionContext` it was rendered from (in `meta`), so
every controller, model-backed or not, answers the very situation the label was made for.
Writes `controller_eval.json` and `controller_eval.md` into `--out`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rir_runtime.controllers import make_controller
from rir_runtime.decisions import Decision, DecisionKind, parse
from rir_runtime.errors import ParseError, UserInputError
from rir_runtime.jobs import _backend, check_controller_name
from rir_runtime.prompts import DecisionContext


@dataclass
class ControllerEvalConfig:
    data: str = field(default="data/controller", metadata={"help": "folder holding review_sft, locate_sft, ..."})
    controller: list[str] = field(default_factory=lambda: ["heuristic"], metadata={"help": "comma list of controllers"})
    split: str = field(
        default="validation", metadata={"help": "dataset split to score", "choices": ["train", "validation"]}
    )
    max_rows: int = field(default=200, metadata={"help": "rows per dataset at most (0: all)"})
    out: str = field(default="runs/eval-controller", metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        for spec in self.controller:
            check_controller_name(spec)
            if spec == "oracle":
                raise ValueError("the oracle produced these labels; score heuristic, prompted:<m> or tuned:<adapter>")


def _rows(data: Path, name: str, split: str, max_rows: int) -> list[dict[str, Any]]:
    from datasets import load_from_disk

    folder = data / name
    if not folder.exists():
        return []
    dataset = load_from_disk(str(folder))
    if split not in dataset:
        return []
    rows = dataset[split]
    rows = rows.select(range(min(max_rows, len(rows)))) if max_rows else rows
    return [r for r in rows if r["meta"].get("context")]


def _f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score_controller(spec: str, data: Path, split: str, max_rows: int) -> dict[str, Any]:
    """All metrics of one controller; a metric without rows is None."""
    from tqdm import tqdm

    controller = make_controller(spec, _backend)
    m: dict[str, Any] = {"controller": spec}
    latency: list[float] = []

    calls: dict[DecisionKind, Callable[[DecisionContext], Decision]] = {
        "review": controller.review,
        "locate_coarse": controller.locate_coarse,
        "locate_fine": controller.locate_fine,
        "reflect": controller.reflect,
    }

    answered: dict[tuple[str, str], Decision] = {}

    def decide(kind: DecisionKind, row: dict[str, Any]) -> Decision:
        """The controller's decision on the row's situation; a situation that several rows share
        (a reflection and its preference pairs) is decided once."""
        key = (kind, row["meta"]["context"])
        if key not in answered:
            ctx = DecisionContext.from_json(row["meta"]["context"])
            start = time.perf_counter()
            answered[key] = calls[kind](ctx)
            latency.append(time.perf_counter() - start)
        return answered[key]

    review = _rows(data, "review_sft", split, max_rows)
    tp = fp = fn = correct = 0
    for row in tqdm(review, desc=f"{spec}: review", file=sys.stderr, mininterval=2.0):
        pred = decide("review", row).value.recover
        truth = row["meta"]["label"] == "recover"
        tp, fp, fn = tp + (pred and truth), fp + (pred and not truth), fn + (truth and not pred)
        correct += pred == truth
    if review:
        p, r, f1 = _f1(tp, fp, fn)
        m.update(
            review_rows=len(review),
            review_accuracy=correct / len(review),
            review_precision=p,
            review_recall=r,
            review_f1=f1,
        )

    locate = _rows(data, "locate_sft", split, max_rows)
    coarse = [row for row in locate if row["meta"]["decision"] == "locate_coarse"]
    fine = [row for row in locate if row["meta"]["decision"] == "locate_fine"]
    if coarse:
        hits = sum(int(decide("locate_coarse", row).value) == int(row["meta"]["label"]) for row in coarse)
        m.update(coarse_rows=len(coarse), coarse_accuracy=hits / len(coarse))
    if fine:
        diffs = [abs(int(decide("locate_fine", row).value) - int(row["meta"]["label"])) for row in fine]
        m.update(
            fine_rows=len(fine),
            restore_exact=sum(d == 0 for d in diffs) / len(fine),
            restore_within_one=sum(d <= 1 for d in diffs) / len(fine),
        )

    reflect = _rows(data, "reflect_sft", split, max_rows)
    if reflect:
        valid = matches = 0
        for row in reflect:
            decision = decide("reflect", row)
            valid += decision.parse_failures == 0 and not decision.meta.get("fallback")
            target = parse("reflect", row["completion"][0]["content"]).failure
            got = decision.value.failure
            matches += bool(target and got and got.action.strip().lower() == target.action.strip().lower())
        m.update(
            reflect_rows=len(reflect),
            reflect_json_valid=valid / len(reflect),
            reflect_failure_action_match=matches / len(reflect),
        )

    prefs = _rows(data, "reflect_pref", split, max_rows)
    if prefs:
        wins = 0
        for row in prefs:
            got = decide("reflect", row).value.failure
            chosen = _failure_action(row["chosen"][0]["content"])
            rejected = _failure_action(row["rejected"][0]["content"])
            action = got.action.strip().lower() if got else ""
            wins += action == chosen and action != rejected
        m.update(pref_rows=len(prefs), reflect_pref_win_rate=wins / len(prefs))
    m["latency_s"] = sum(latency) / len(latency) if latency else None
    m["decisions"] = len(latency)
    return m


def _failure_action(text: str) -> str:
    try:
        failure = parse("reflect", text).failure
    except ParseError:
        return ""
    return failure.action.strip().lower() if failure else ""


METRICS = [
    ("review_accuracy", "review accuracy"),
    ("review_precision", "review precision (recover)"),
    ("review_recall", "review recall (recover)"),
    ("review_f1", "review F1"),
    ("coarse_accuracy", "coarse segment accuracy"),
    ("restore_exact", "restore point exact"),
    ("restore_within_one", "restore point within one step"),
    ("reflect_json_valid", "reflection JSON valid"),
    ("reflect_failure_action_match", "reflection names the fatal action"),
    ("reflect_pref_win_rate", "reflection preference win rate"),
    ("latency_s", "latency per decision (s)"),
]


def markdown(results: list[dict[str, Any]], split: str) -> str:
    lines = [f"# Controller decision quality ({split} split)", ""]
    for res in results:
        lines += [f"## {res['controller']}", "", "| metric | value |", "| --- | ---: |"]
        for key, label in METRICS:
            value = res.get(key)
            if value is not None:
                lines.append(f"| {label} | {value:.3f} |" if key == "latency_s" else f"| {label} | {value:.1%} |")
        lines.append("")
    return "\n".join(lines)


def evaluate_controllers(cfg: ControllerEvalConfig) -> list[dict[str, Any]]:
    data = Path(cfg.data)
    if not (data / "review_sft").exists():
        raise UserInputError(f"{data} holds no review_sft dataset: build one with `rir build-data --out {data}`")
    results = [score_controller(spec, data, cfg.split, cfg.max_rows) for spec in cfg.controller]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "controller_eval.json").write_text(json.dumps({"results": results, "config": asdict(cfg)}, indent=2) + "\n")
    (out / "controller_eval.md").write_text(markdown(results, cfg.split))
    return results
