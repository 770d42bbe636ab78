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

from eval.metrics import auroc, auroc_within, binary_quality
from eval.when_features import feature_reference
from rir_runtime.controllers import make_controller
from rir_runtime.decisions import Decision, DecisionKind, parse
from rir_runtime.errors import ParseError, UserInputError
from rir_runtime.jobs import _backend, check_controller_name
from rir_runtime.prompts import DecisionContext
from train.data import answer_class
from train.reward_eval import decision_reward, review_weights


@dataclass
class ControllerEvalConfig:
    data: str = field(default="data/controller", metadata={"help": "folder holding review_sft, locate_sft, ..."})
    controller: list[str] = field(default_factory=lambda: ["heuristic"], metadata={"help": "comma list of controllers"})
    split: str = field(
        default="validation", metadata={"help": "dataset split to score", "choices": ["train", "validation"]}
    )
    max_rows: int = field(default=200, metadata={"help": "rows per dataset at most (0: all)"})
    max_reflect_rows: int = field(
        default=-1,
        metadata={"help": "reflection rows at most (each is several generations: slow on a CPU); -1: max_rows"},
    )
    source: list[str] = field(
        default_factory=list,
        metadata={"help": "score only rows from these rollout folders (path or folder name); empty: all rows"},
    )
    out: str = field(default="runs/eval-controller", metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        for spec in self.controller:
            check_controller_name(spec)
            if spec == "oracle":
                raise ValueError("the oracle produced these labels; score heuristic, prompted:<m> or tuned:<adapter>")


def from_source(row: dict[str, Any], source: list[str]) -> bool:
    run = str(row["meta"].get("source_run", ""))
    return not source or run in source or Path(run).name in source


def scored_rows(
    data: Path, name: str, split: str, max_rows: int, source: list[str], stratify: bool = False
) -> list[dict[str, Any]]:
    """The split's scorable rows from the given rollouts; a cap takes evenly spaced rows, since rows
    come in blocks by rollout folder and task and the first N would be one block. `stratify`: the
    cap is shared equally by decision and answer class (restore points: stay or step back, as far
    as each has rows), so a rare class is scored on more than one or two rows."""
    from datasets import load_from_disk

    folder = data / name
    if not folder.exists():
        return []
    dataset = load_from_disk(str(folder))
    if split not in dataset:
        return []
    rows = [r for r in dataset[split] if r["meta"].get("context") and from_source(r, source)]
    if not max_rows or len(rows) <= max_rows:
        return rows
    if not stratify:
        return _spaced(rows, max_rows)
    return [rows[i] for i in share_cap([(r["meta"]["decision"], answer_class(r["meta"])) for r in rows], max_rows)]


def share_cap(keys: list[Any], n: int) -> list[int]:
    """Indices of at most `n` items shared equally by the groups their `keys` form (a group with
    fewer items gives up the rest of its share to the others), evenly spaced within each group and
    in their original order: a rare group is not left to one or two rows, nor a block to fill the cap."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    picked: list[int] = []
    left = n
    for k, group in enumerate(sorted(groups.values(), key=len)):  # small groups first: they give up their share
        take = min(len(group), left // (len(groups) - k))
        picked += _spaced(group, take)
        left -= take
    return sorted(picked)


def _spaced(items: list[Any], n: int) -> list[Any]:
    return [items[i * len(items) // n] for i in range(n)] if n < len(items) else items


def score_controller(
    spec: str,
    data: Path,
    split: str,
    max_rows: int,
    max_reflect_rows: int = -1,
    source: list[str] | None = None,
    weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """All metrics of one controller; a metric without rows is None. `weights`: the review class
    weights of the rewards (`review_weights(data)` when not given; pass them to score several)."""
    from tqdm import tqdm

    source = source or []
    weights = review_weights(data) if weights is None else weights

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
    rewards: dict[str, list[float]] = {}

    def reward(kind: DecisionKind, row: dict[str, Any], decision: Decision) -> None:
        """Record the GRPO reward of a review or locate decision (rows without values have none)."""
        value = decision_reward(kind, decision.value, row, weights)
        if value is not None:
            rewards.setdefault("review" if kind == "review" else "locate", []).append(value)

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

    review = scored_rows(data, "review_sft", split, max_rows, source)
    labels, predictions, scores, envs = [], [], [], []
    for row in tqdm(review, desc=f"{spec}: review", file=sys.stderr, mininterval=2.0):
        decision = decide("review", row)
        reward("review", row, decision)
        labels.append(row["meta"]["label"] == "recover")
        predictions.append(decision.value.recover)
        # a ranked controller's log-odds margin orders the rows; a rule's verdict is its only score
        scores.append(float(decision.meta.get("margin", float(decision.value.recover))))
        envs.append(str(row["meta"].get("env", "")))
    if review:
        q = binary_quality(labels, predictions, scores)
        m.update({f"review_{k}": v for k, v in q.to_dict().items()})
        m["review_auroc_within_env"] = auroc_within(labels, scores, envs)
        m["review_margins"] = scores

    locate = scored_rows(data, "locate_sft", split, max_rows, source, stratify=True)
    coarse = [row for row in locate if row["meta"]["decision"] == "locate_coarse"]
    fine = [row for row in locate if row["meta"]["decision"] == "locate_fine"]
    for row in locate:
        reward(row["meta"]["decision"], row, decide(row["meta"]["decision"], row))
    if coarse:
        hits = sum(int(decide("locate_coarse", row).value) == int(row["meta"]["label"]) for row in coarse)
        m.update(coarse_rows=len(coarse), coarse_accuracy=hits / len(coarse))
    if fine:
        # meta.step is the branch's length at the review: the current checkpoint
        picks = [
            (int(decide("locate_fine", row).value), int(row["meta"]["label"]), int(row["meta"]["step"])) for row in fine
        ]
        m.update(restore_quality(picks))

    for name, values in rewards.items():
        m[f"{name}_reward"] = sum(values) / len(values)
    every = [v for values in rewards.values() for v in values]
    m["mean_reward"] = sum(every) / len(every) if every else None

    reflect_cap = max_rows if max_reflect_rows < 0 else max_reflect_rows
    reflect = scored_rows(data, "reflect_sft", split, reflect_cap, source) if reflect_cap or not max_rows else []
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

    prefs = scored_rows(data, "reflect_pref", split, reflect_cap, source) if reflect_cap or not max_rows else []
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


def step_reference(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How well the review's step index alone ranks "recover" above "continue" on the scored rows:
    the bar a learned When has to clear before it has learned more than how late in the episode a
    review comes (later reviews are more often past a fatal mistake, so on hindsight labels the bar
    can be high)."""
    labels = [r["meta"]["label"] == "recover" for r in rows]
    steps = [float(r["meta"]["step"]) for r in rows]
    envs = [str(r["meta"].get("env", "")) for r in rows]
    return {
        "review_rows": len(rows),
        "review_auroc_by_step": auroc(labels, steps) if rows else None,
        "review_auroc_by_step_within_env": auroc_within(labels, steps, envs) if rows else None,
    }


def restore_quality(picks: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Restore-point metrics from (pick, label, current checkpoint) triples. Stay rows (the label is
    the current checkpoint: recover without rolling back) are also scored apart from step-back rows,
    since a Where that always steps back and one that always stays fail on different rows. The
    current checkpoint is the branch's length: a branch that has ended does not offer it."""
    stay = [(pick, now) for pick, label, now in picks if label == now]
    back = [(pick, label) for pick, label, now in picks if label != now]
    return {
        "fine_rows": len(picks),
        "restore_exact": sum(pick == label for pick, label, _ in picks) / len(picks),
        "restore_within_one": sum(abs(pick - label) <= 1 for pick, label, _ in picks) / len(picks),
        "stay_rows": len(stay),
        "stay_accuracy": sum(pick == now for pick, now in stay) / len(stay) if stay else None,
        "back_rows": len(back),
        "back_exact": sum(pick == label for pick, label in back) / len(back) if back else None,
    }


def _failure_action(text: str) -> str:
    try:
        failure = parse("reflect", text).failure
    except ParseError:
        return ""
    return failure.action.strip().lower() if failure else ""


METRICS = [
    ("review_rows", "review rows (recover)"),
    ("review_balanced_accuracy", "review balanced accuracy"),
    ("review_f1", "review F1 (recover)"),
    ("review_auroc", "review AUROC"),
    ("review_auroc_within_env", "review AUROC within a benchmark"),
    ("review_precision", "review precision (recover)"),
    ("review_recall", "review recall (recover)"),
    ("review_accuracy", "review accuracy"),
    ("review_majority_accuracy", "review accuracy of always the majority answer"),
    ("review_majority_f1", "review F1 of always the majority answer"),
    ("coarse_accuracy", "coarse segment accuracy"),
    ("restore_exact", "restore point exact"),
    ("restore_within_one", "restore point within one step"),
    ("stay_accuracy", "stays where it should (rows labelled stay)"),
    ("back_exact", "restore point exact (rows labelled step back)"),
    ("review_reward", "GRPO reward: review"),
    ("locate_reward", "GRPO reward: locate (coarse and fine)"),
    ("mean_reward", "GRPO reward: mean over review and locate rows"),
    ("reflect_json_valid", "reflection JSON valid"),
    ("reflect_failure_action_match", "reflection names the fatal action"),
    ("reflect_pref_win_rate", "reflection preference win rate"),
    ("latency_s", "latency per decision (s)"),
]


def _cell(key: str, res: dict[str, Any]) -> str:
    value = res.get(key)
    if value is None:
        return "-"
    if key == "review_rows":
        return f"{value} ({res.get('review_positives', 0)})"
    if key in ("stay_accuracy", "back_exact"):
        rows = res.get("stay_rows" if key == "stay_accuracy" else "back_rows")
        return f"{value:.1%} ({rows})"
    if key.startswith("review_auroc") or key == "latency_s" or key.endswith("reward"):
        return f"{value:.3f}"
    return f"{value:.1%}"


def markdown(
    results: list[dict[str, Any]],
    split: str,
    source: list[str] | None = None,
    reference: dict[str, Any] | None = None,
) -> str:
    """One table: metrics as rows, controllers as columns (the majority baseline is the bar to clear),
    then the review AUROC of the step index alone (`step_reference`) and of a feature model
    (`feature_reference`), the bars for the ranking."""
    names = [r["controller"] for r in results]
    rows_from = f", rows from {', '.join(f'`{Path(s).name}`' for s in source)}" if source else ""
    lines = [
        f"# Controller decision quality ({split} split{rows_from})",
        "",
        "| metric | " + " | ".join(f"`{n}`" for n in names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    for key, label in METRICS:
        if any(r.get(key) is not None for r in results):
            lines.append(f"| {label} | " + " | ".join(_cell(key, r) for r in results) + " |")
    by_step = (reference or {}).get("review_auroc_by_step")
    if by_step is not None:
        within = reference.get("review_auroc_by_step_within_env") if reference else None
        lines += [
            "",
            f"Reference: ranking these {reference['review_rows'] if reference else 0} reviews by their step index "
            f"alone gives AUROC {by_step:.3f}"
            + (f" ({within:.3f} within a benchmark)" if within is not None else "")
            + "; a learned When that ranks below it has not learned more than how late a review comes.",
        ]
    by_features = (reference or {}).get("review_auroc_by_features")
    if by_features is not None and reference:
        within = reference.get("review_auroc_by_features_within_env")
        lines.append(
            f"A logistic regression on the signals the prompt states (`eval/when_features.py`), fitted on "
            f"{reference['feature_train_rows']} train reviews, ranks them at AUROC {by_features:.3f}"
            + (f" ({within:.3f} within a benchmark)" if within is not None else "")
            + ": the bar for a When that reads more than the prompt's surface."
        )
    return "\n".join(lines) + "\n"


def evaluate_controllers(cfg: ControllerEvalConfig) -> list[dict[str, Any]]:
    data = Path(cfg.data)
    if not (data / "review_sft").exists():
        raise UserInputError(f"{data} holds no review_sft dataset: build one with `rir build-data --out {data}`")
    weights = review_weights(data)
    results = [
        score_controller(spec, data, cfg.split, cfg.max_rows, cfg.max_reflect_rows, cfg.source, weights)
        for spec in cfg.controller
    ]
    if not any(r.get("decisions") for r in results) and cfg.source:
        raise UserInputError(f"no {cfg.split} rows of {data} come from {cfg.source}: check the rollout folder names")
    reviews = scored_rows(data, "review_sft", cfg.split, cfg.max_rows, cfg.source)
    # fitted on the train split, so scoring that split would rank the rows it was fitted on: no figure then
    train = scored_rows(data, "review_sft", "train", 0, []) if cfg.split != "train" else []
    reference = step_reference(reviews) | feature_reference(train, reviews)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"results": results, "reference": reference, "config": asdict(cfg)}
    (out / "controller_eval.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "controller_eval.md").write_text(markdown(results, cfg.split, cfg.source, reference))
    return results
