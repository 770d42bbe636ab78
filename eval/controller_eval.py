"""`rir eval-controller`: offline decision quality of controllers on held-out labelled datasets.

    rir eval-controller --data data/controller --controller heuristic,prompted:smollm2-135m-instruct,tuned:adapters/sft

Each row of the `*_sft` datasets keeps the `DecisionContext` it was rendered from (in `meta`), so
every controller, model-backed or not, answers the very situation the label was made for.
Writes `controller_eval.json` and `controller_eval.md` into `--out`.

The Where is scored end to end, as the runtime serves it (`rir_runtime/loop.py` `_localise`): a
coarse segment of the whole branch, then a checkpoint inside the segment the controller chose. A
fine-restore row is built inside the labelled segment, so scoring it alone measures the easy half;
those figures are kept, labelled "given the gold segment". The figures that compare controllers
carry percentile bootstrap 95% intervals (`data_gen/scoring/metrics.py`), and a `tuned:` adapter trained on data
of another label or prompt format version than `--data` is refused.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from data_gen.build_record import BUILD_RECORD, read_build_record
from data_gen.scoring.answers import answer_class, share_cap, spaced
from data_gen.scoring.metrics import (
    Interval,
    auroc,
    auroc_ci,
    auroc_within,
    binary_intervals,
    binary_quality,
    gain_calibration,
    mean_ci,
)
from data_gen.scoring.rewards import decision_reward, review_weights
from eval.when_features import feature_reference
from rir_runtime.controllers import (
    Controller,
    ControllerSpec,
    check_controller_name,
    latest_admissible_in,
    make_controller,
)
from rir_runtime.decisions import Decision, DecisionKind, parse
from rir_runtime.errors import ParseError, UserInputError
from rir_runtime.llm.shared import shared_backend
from rir_runtime.prompts import DecisionContext
from rir_runtime.values import complete_values

CONTROLLER_EVAL = "controller_eval.json"  # the results, the reference bars and the config (docs/contracts.md)


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
            if check_controller_name(spec).uses_hindsight:
                raise ValueError(
                    f"{spec} needs hindsight of a running episode (the oracle produced these labels); score "
                    "heuristic, prompted:<m> or tuned:<adapter>"
                )


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
    return cap_rows(split_rows(data, name, split, source), max_rows, stratify)


def split_rows(data: Path, name: str, split: str, source: list[str]) -> list[dict[str, Any]]:
    """Every scorable row of the split (it keeps its context) from the given rollouts, uncapped."""
    from datasets import load_from_disk

    folder = data / name
    if not folder.exists():
        return []
    dataset = load_from_disk(str(folder))
    if split not in dataset:
        return []
    return [r for r in dataset[split] if r["meta"].get("context") and from_source(r, source)]


def cap_rows(rows: list[dict[str, Any]], max_rows: int, stratify: bool = False) -> list[dict[str, Any]]:
    """At most `max_rows` of `rows` (0: all), as `scored_rows` takes them."""
    if not max_rows or len(rows) <= max_rows:
        return rows
    if not stratify:
        return spaced(rows, max_rows)
    return [rows[i] for i in share_cap([(r["meta"]["decision"], answer_class(r["meta"])) for r in rows], max_rows)]


# --- the Where end to end -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestorePoint:
    """One labelled recovery as the runtime meets it: the context of its `locate_coarse` row (the
    whole branch's segments; a point whose branch has a single segment has only a `locate_fine` row,
    and that row's context), the fine label, the current checkpoint and the measured values."""

    ctx: DecisionContext
    restore: int  # meta.restore: the checkpoint hindsight restores to
    now: int  # meta.step: the branch's length, the current checkpoint (a stay restores to it)
    measured: dict[int, float]  # meta.values (probed checkpoints only); empty for rows built without it


PointKey = tuple[str, str, int, str]


def point_key(row: dict[str, Any]) -> PointKey:
    """The restore point a locate row belongs to: its episode and step (and rollout folder), and its
    context without the chosen segment, so two reviews of one episode at the same step stay apart."""
    meta = row["meta"]
    ctx = replace(DecisionContext.from_json(meta["context"]), segment=None)
    return str(meta.get("source_run", "")), str(meta.get("episode_id", "")), int(meta["step"]), ctx.to_json()


def restore_points(every: list[dict[str, Any]], scored: list[dict[str, Any]]) -> list[RestorePoint]:
    """The restore points of the `scored` locate rows, in their order, each from its rows in `every`
    (the whole split: a cap may have kept a point's fine row and not its coarse one). A point whose
    rows carry no fine label (`meta.restore`, or a fine row's label) is left out."""
    keys = {id(row): point_key(row) for row in every}
    rows_of: dict[PointKey, dict[str, dict[str, Any]]] = {}
    for row in every:
        rows_of.setdefault(keys[id(row)], {}).setdefault(row["meta"]["decision"], row)
    points = []
    for key in dict.fromkeys(keys.get(id(row)) or point_key(row) for row in scored):
        rows = rows_of[key]
        row = rows.get("locate_coarse") or rows["locate_fine"]
        meta = row["meta"]
        restore = meta.get("restore")
        if restore is None and "locate_fine" in rows:  # coarse rows built before meta.restore existed
            restore = rows["locate_fine"]["meta"]["label"]
        if restore is None:
            continue
        ctx = DecisionContext.from_json(meta["context"])
        points.append(RestorePoint(ctx, int(restore), int(meta["step"]), measured_values(meta)))
    return points


Locate = Callable[[DecisionKind, DecisionContext], Decision]


def locate_as_served(ctx: DecisionContext, decide: Locate) -> int:
    """The checkpoint the runtime restores to, as `rir_runtime/loop.py` `_localise` finds it: a
    coarse segment of the whole branch (asked only when there are several), then a checkpoint
    inside the chosen one; a checkpoint that is not admissible falls back to the latest admissible
    one inside the segment."""
    segs = ctx.segments or ((0, max(ctx.admissible, default=0) + 1),)
    index = 0
    if len(segs) > 1:
        index = min(max(int(decide("locate_coarse", ctx).value), 0), len(segs) - 1)
    ctx = replace(ctx, segment=segs[index])
    step = int(decide("locate_fine", ctx).value)
    return step if step in ctx.admissible else latest_admissible_in(ctx)


def value_regret(point: RestorePoint, pick: int) -> float | None:
    """Best V over the admissible checkpoints less V of the pick: what the pick gives up (0 for a
    pick as good as the label). An unprobed checkpoint takes the next probed value after it, as the
    GRPO rewards read it (`data_gen/scoring/rewards.py`). None for a row without values."""
    if not point.measured:
        return None
    values = complete_values(point.measured, [*point.ctx.admissible, pick]).values
    return max(values[i] for i in point.ctx.admissible) - values[pick] if point.ctx.admissible else 0.0


def where_quality(points: list[RestorePoint], picks: list[int], prefix: str = "where") -> dict[str, Any]:
    """End-to-end Where figures of the `picks` (one per point): exact, within one, stay accuracy and
    step-back exact (as `restore_quality` scores them), the exact rate's bootstrap interval, and the
    mean value regret (None where the rows carry no values)."""
    q = restore_quality([(pick, p.restore, p.now) for p, pick in zip(points, picks, strict=True)])
    regrets = [r for p, pick in zip(points, picks, strict=True) if (r := value_regret(p, pick)) is not None]
    return {
        f"{prefix}_points": q["fine_rows"],
        f"{prefix}_exact": q["restore_exact"],
        f"{prefix}_exact_ci95": mean_ci([pick == p.restore for p, pick in zip(points, picks, strict=True)]),
        f"{prefix}_within_one": q["restore_within_one"],
        f"{prefix}_stay_rows": q["stay_rows"],
        f"{prefix}_stay_accuracy": q["stay_accuracy"],
        f"{prefix}_back_rows": q["back_rows"],
        f"{prefix}_back_exact": q["back_exact"],
        f"{prefix}_value_regret": sum(regrets) / len(regrets) if regrets else None,
    }


def stay_reference(points: list[RestorePoint]) -> dict[str, Any]:
    """The bar for an end-to-end Where: always stay (restore to the current checkpoint, the latest
    admissible one, i.e. recover without rolling back)."""
    if not points:
        return {}
    q = where_quality(points, [max(p.ctx.admissible, default=0) for p in points], "where_always_stay")
    keys = ("where_always_stay_exact", "where_always_stay_exact_ci95", "where_always_stay_value_regret")
    return {"where_points": len(points)} | {k: q[k] for k in keys}


# --- versions ---------------------------------------------------------------------------------------------
# (build.json key, adapter card key, what it is): the data an adapter was trained on and the data it is
# scored on must agree on both, or the offline figures compare labels that mean different things
VERSIONS = (
    ("label_version", "data_label_version", "label version"),
    ("prompt_format_version", "data_prompt_format_version", "controller prompt format version"),
)
_WARNED: set[str] = set()


def built_versions(data: Path) -> dict[str, Any]:
    """The label and prompt format versions the data's `build.json` records (absent: built before they were)."""
    build = read_build_record(data, or_parent=False)
    return {key: build.get(key) for key, _, _ in VERSIONS}


def check_versions(data: Path, specs: list[str]) -> None:
    """Refuse to score a `tuned:` adapter trained on data of another label or prompt format version
    than `data`: its figures would compare labels that mean different things. Data or cards written
    before the versions were recorded are scored, with one warning."""
    from rir_runtime.llm.card import read_card

    adapters = list(dict.fromkeys(a for spec in specs for a in ControllerSpec.parse(spec).arguments_of("tuned")))
    built = built_versions(data)
    unknown = [f"{data}/{BUILD_RECORD}"] if adapters and None in built.values() else []
    for adapter in adapters:
        card = read_card(adapter)
        trained = {key: card.get(card_key) for key, card_key, _ in VERSIONS}
        if None in trained.values():
            unknown.append(adapter)
        if any(None not in (trained[key], built[key]) and trained[key] != built[key] for key, _, _ in VERSIONS):
            raise UserInputError(version_mismatch(adapter, data, trained, built))
    if unknown:
        warn_once(
            f"warning: {' and '.join(unknown)} record no label or prompt format version (written before "
            "they were), so whether the adapters were trained on labels like these is not checked; rebuild "
            "the data with `rir build-data` and retrain to have it checked"
        )


def version_mismatch(adapter: str, data: Path, trained: dict[str, Any], built: dict[str, Any]) -> str:
    """The refusal: both sides' versions, and the two ways to make them agree."""

    def said(versions: dict[str, Any]) -> str:
        return " and ".join(f"{what} {versions[key]}" for key, _, what in VERSIONS)

    return (
        f"adapter {adapter} was trained on data of {said(trained)}, but {data} holds {said(built)}: "
        f"score it on data of its versions (rebuild the data with `rir build-data`), or retrain the adapter "
        f"on this data (`rir train sft --data {data}`)"
    )


def warn_once(message: str) -> None:
    """One line on stderr, once per process (the pipeline scores each row group apart)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(message, file=sys.stderr)


class Decisions:
    """One controller's decisions on the rows' situations. A situation that several rows share (a
    reflection and its preference pairs, a restore point's fine row and its end-to-end locate) is
    decided once; the time each decision took is kept, and the GRPO reward of each review and locate
    decision (rows without values have none)."""

    def __init__(self, controller: Controller, weights: dict[str, float]) -> None:
        self.calls: dict[DecisionKind, Callable[[DecisionContext], Decision]] = {
            "review": controller.review,
            "locate_coarse": controller.locate_coarse,
            "locate_fine": controller.locate_fine,
            "reflect": controller.reflect,
        }
        self.weights = weights
        self.answered: dict[tuple[str, str], Decision] = {}
        self.latency: list[float] = []
        self.rewards: dict[str, list[float]] = {}

    def decide_in(self, kind: DecisionKind, ctx: DecisionContext, text: str | None = None) -> Decision:
        """The controller's decision in a situation (`text`: its JSON, where known)."""
        key = (kind, text or ctx.to_json())
        if key not in self.answered:
            start = time.perf_counter()
            self.answered[key] = self.calls[kind](ctx)
            self.latency.append(time.perf_counter() - start)
        return self.answered[key]

    def decide(self, kind: DecisionKind, row: dict[str, Any]) -> Decision:
        """The controller's decision on the row's situation."""
        text = row["meta"]["context"]
        if (kind, text) in self.answered:
            return self.answered[(kind, text)]
        return self.decide_in(kind, DecisionContext.from_json(text), text)

    def reward(self, kind: DecisionKind, row: dict[str, Any], decision: Decision) -> None:
        """Record the GRPO reward of a review or locate decision (rows without values have none)."""
        value = decision_reward(kind, decision.value, row, self.weights)
        if value is not None:
            self.rewards.setdefault("review" if kind == "review" else "locate", []).append(value)

    def reward_metrics(self) -> dict[str, Any]:
        """The mean reward of the review and of the locate decisions, and of both."""
        m: dict[str, Any] = {f"{name}_reward": sum(values) / len(values) for name, values in self.rewards.items()}
        every = [v for values in self.rewards.values() for v in values]
        m["mean_reward"] = sum(every) / len(every) if every else None
        return m

    def timing(self) -> dict[str, Any]:
        return {
            "latency_s": sum(self.latency) / len(self.latency) if self.latency else None,
            "decisions": len(self.latency),
        }


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
    source = source or []
    weights = review_weights(data) if weights is None else weights
    decisions = Decisions(make_controller(spec, shared_backend), weights)
    m: dict[str, Any] = {"controller": spec}
    m.update(review_metrics(decisions, scored_rows(data, "review_sft", split, max_rows, source), spec))
    every_locate = split_rows(data, "locate_sft", split, source)
    m.update(locate_metrics(decisions, every_locate, cap_rows(every_locate, max_rows, stratify=True)))
    m.update(decisions.reward_metrics())
    reflect_cap = max_rows if max_reflect_rows < 0 else max_reflect_rows
    scored = reflect_cap or not max_rows
    m.update(reflect_metrics(decisions, scored_rows(data, "reflect_sft", split, reflect_cap, source) if scored else []))
    m.update(pref_metrics(decisions, scored_rows(data, "reflect_pref", split, reflect_cap, source) if scored else []))
    m.update(decisions.timing())
    return m


def review_metrics(decisions: Decisions, review: list[dict[str, Any]], spec: str) -> dict[str, Any]:
    """The When's figures on the review rows: the binary quality of "recover" with its intervals, the
    AUROC within a benchmark, and every row's margin."""
    from tqdm import tqdm

    labels, predictions, scores, envs = [], [], [], []
    claims: list[tuple[float, float, bool]] = []  # a value controller's claimed gain, the gain realised, recover
    for row in tqdm(review, desc=f"{spec}: review", file=sys.stderr, mininterval=2.0):
        decision = decisions.decide("review", row)
        decisions.reward("review", row, decision)
        labels.append(row["meta"]["label"] == "recover")
        predictions.append(decision.value.recover)
        # a ranked controller's log-odds margin orders the rows; a rule's verdict is its only score
        scores.append(float(decision.meta.get("margin", float(decision.value.recover))))
        envs.append(str(row["meta"].get("env", "")))
        realised = realised_gain(row["meta"], decision.meta.get("restore"))
        if realised is not None:
            claims.append((scores[-1], realised, predictions[-1]))
    if not review:
        return {}
    q = binary_quality(labels, predictions, scores)
    m: dict[str, Any] = {f"review_{k}": v for k, v in q.to_dict().items()}
    m.update({f"review_{k}": v for k, v in binary_intervals(labels, predictions, scores).items()})
    m["review_auroc_within_env"] = auroc_within(labels, scores, envs)
    m["review_margins"] = scores
    if claims:
        m["review_gain_calibration"] = gain_calibration([c for c, _, _ in claims], [r for _, r, _ in claims])
        recovered = [r for _, r, recover in claims if recover]
        m["review_realised_gain_when_recovering"] = sum(recovered) / len(recovered) if recovered else None
    return m


def measured_values(meta: dict[str, Any]) -> dict[int, float]:
    """A row's measured checkpoint values ({} where the row has none)."""
    return {int(k): float(v) for k, v in json.loads(meta["values"]).items()} if meta.get("values") else {}


def realised_gain(meta: dict[str, Any], restore: Any) -> float | None:
    """The hindsight value of recovering to `restore` less that of going on (the row's value table);
    None where the controller names no checkpoint or the table has no value for it."""
    if restore is None or "v_now" not in meta:
        return None
    value = measured_values(meta).get(int(restore))
    return None if value is None else value - float(meta["v_now"])


def locate_metrics(
    decisions: Decisions, every_locate: list[dict[str, Any]], locate: list[dict[str, Any]]
) -> dict[str, Any]:
    """The Where's figures: end to end as the runtime serves it (first), then the coarse rows alone, and
    the fine rows given the gold segment."""
    m: dict[str, Any] = {}
    coarse = [row for row in locate if row["meta"]["decision"] == "locate_coarse"]
    fine = [row for row in locate if row["meta"]["decision"] == "locate_fine"]
    for row in locate:
        decisions.reward(row["meta"]["decision"], row, decisions.decide(row["meta"]["decision"], row))
    points = restore_points(every_locate, locate)
    if points:  # end to end first: the Where as the runtime serves it
        m.update(where_quality(points, [locate_as_served(p.ctx, decisions.decide_in) for p in points]))
        m.update(stay_reference(points))
    if coarse:
        hits = [int(decisions.decide("locate_coarse", row).value) == int(row["meta"]["label"]) for row in coarse]
        m.update(coarse_rows=len(coarse), coarse_accuracy=sum(hits) / len(coarse), coarse_accuracy_ci95=mean_ci(hits))
    if fine:  # given the gold segment: each fine row is built inside the labelled segment
        # meta.step is the branch's length at the review: the current checkpoint
        picks = [
            (int(decisions.decide("locate_fine", row).value), int(row["meta"]["label"]), int(row["meta"]["step"]))
            for row in fine
        ]
        m.update(restore_quality(picks))
    return m


def reflect_metrics(decisions: Decisions, reflect: list[dict[str, Any]]) -> dict[str, Any]:
    """The What's figures on the reflection rows: valid JSON without a fallback, and the fatal action named."""
    if not reflect:
        return {}
    valid = matches = 0
    for row in reflect:
        decision = decisions.decide("reflect", row)
        valid += decision.parse_failures == 0 and not decision.meta.get("fallback")
        target = parse("reflect", row["completion"][0]["content"]).failure
        got = decision.value.failure
        matches += bool(target and got and got.action.strip().lower() == target.action.strip().lower())
    return {
        "reflect_rows": len(reflect),
        "reflect_json_valid": valid / len(reflect),
        "reflect_failure_action_match": matches / len(reflect),
    }


def pref_metrics(decisions: Decisions, prefs: list[dict[str, Any]]) -> dict[str, Any]:
    """How often the reflection blames the chosen side's action of a preference pair and not the rejected's."""
    if not prefs:
        return {}
    wins = 0
    for row in prefs:
        got = decisions.decide("reflect", row).value.failure
        chosen = _failure_action(row["chosen"][0]["content"])
        rejected = _failure_action(row["rejected"][0]["content"])
        action = got.action.strip().lower() if got else ""
        wins += action == chosen and action != rejected
    return {"pref_rows": len(prefs), "reflect_pref_win_rate": wins / len(prefs)}


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
        "review_auroc_by_step_ci95": auroc_ci(labels, steps) if rows else None,
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
    ("where_points", "restore points (end to end: coarse segment, then a checkpoint in it, as served)"),
    ("where_exact", "restore point exact, end to end"),
    ("where_always_stay_exact", "restore point exact, end to end, of always staying (the bar)"),
    ("where_within_one", "restore point within one step, end to end"),
    ("where_stay_accuracy", "stays where it should, end to end (points labelled stay)"),
    ("where_back_exact", "restore point exact, end to end (points labelled step back)"),
    ("where_value_regret", "value regret, end to end (best V less V of the pick; 0 is best)"),
    ("coarse_accuracy", "coarse segment accuracy"),
    ("restore_exact", "restore point exact, given the gold segment"),
    ("restore_within_one", "restore point within one step, given the gold segment"),
    ("stay_accuracy", "stays where it should, given the gold segment (rows labelled stay)"),
    ("back_exact", "restore point exact, given the gold segment (rows labelled step back)"),
    ("review_reward", "GRPO reward: review"),
    ("locate_reward", "GRPO reward: locate (coarse and fine)"),
    ("mean_reward", "GRPO reward: mean over review and locate rows"),
    ("reflect_json_valid", "reflection JSON valid"),
    ("reflect_failure_action_match", "reflection names the fatal action"),
    ("reflect_pref_win_rate", "reflection preference win rate"),
    ("latency_s", "latency per decision (s)"),
]


ROW_COUNTS = {  # figures shown with the number of rows they are measured on
    "stay_accuracy": "stay_rows",
    "back_exact": "back_rows",
    "where_stay_accuracy": "where_stay_rows",
    "where_back_exact": "where_back_rows",
}


def _cell(key: str, res: dict[str, Any]) -> str:
    value = res.get(key)
    if value is None:
        return "-"
    if key == "review_rows":
        return f"{value} ({res.get('review_positives', 0)})"
    if key == "where_points":
        return str(value)
    if key in ROW_COUNTS:
        return f"{value:.1%} ({res.get(ROW_COUNTS[key])})"
    if key.startswith("review_auroc") or key in ("latency_s", "where_value_regret") or key.endswith("reward"):
        return f"{value:.3f}" + _interval(res.get(f"{key}_ci95"), "{:.2f}")
    return f"{value:.1%}" + _interval(res.get(f"{key}_ci95"), "{:.0%}")


def _interval(ci: Interval | None, fmt: str) -> str:
    """` [lo, hi]` of a bootstrap 95% interval, or nothing."""
    return f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]" if ci else ""


def markdown(
    results: list[dict[str, Any]],
    split: str,
    source: list[str] | None = None,
    reference: dict[str, Any] | None = None,
) -> str:
    """One table: metrics as rows, controllers as columns (the majority baseline and always staying
    are the bars to clear), then the review AUROC of the step index alone (`step_reference`) and of a
    feature model (`feature_reference`), the bars for the ranking."""
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
    if any(r.get("where_exact_ci95") or r.get("review_auroc_ci95") for r in results):
        lines += ["", INTERVALS_NOTE]
    return "\n".join(lines + reference_lines(reference or {}) + gain_lines(results)) + "\n"


def gain_lines(results: list[dict[str, Any]]) -> list[str]:
    """For each controller that claims a gain (a value controller): claimed against realised gain, by
    quarter of the claim, and the mean realised gain of the reviews it recovers at."""
    lines: list[str] = []
    for res in results:
        bins = res.get("review_gain_calibration")
        if not bins:
            continue
        when = res.get("review_realised_gain_when_recovering")
        lines += [
            "",
            f"Claimed against realised gain, `{res['controller']}` (the best recovery's score over going on's, "
            "and in hindsight the value of that checkpoint less going on's; rows in quarters of the claim):",
            "",
            "| claimed gain | rows | mean claimed | mean realised |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {b['claimed_min']:+.2f} to {b['claimed_max']:+.2f} | {b['rows']} | {b['claimed_mean']:+.2f} "
                f"| {b['realised_mean']:+.3f} |"
                for b in bins
            ),
            "",
            "Where it recovers (claim above its margin), the mean realised gain is "
            + ("-" if when is None else f"{when:+.3f}")
            + ": positive if its recoveries pay.",
        ]
    return lines


INTERVALS_NOTE = (
    "In brackets: percentile bootstrap 95% intervals over the rows (over the restore points for the "
    "end-to-end Where), 1,000 resamples. End to end, the controller picks the coarse segment, then the "
    "checkpoint inside it, as the runtime serves it: a wrong segment makes the restore point wrong. "
    '"Given the gold segment" scores the checkpoint inside the labelled segment only.'
)


def reference_lines(reference: dict[str, Any]) -> list[str]:
    """The bars for the When's ranking: the step index alone (`step_reference`) and a feature model
    (`feature_reference`), each with its bootstrap interval."""
    lines: list[str] = []
    by_step = reference.get("review_auroc_by_step")
    if by_step is not None:
        within = reference.get("review_auroc_by_step_within_env")
        ci = reference.get("review_auroc_by_step_ci95")
        lines += [
            "",
            f"Reference: ranking these {reference['review_rows']} reviews by their step index "
            f"alone gives AUROC {by_step:.3f}"
            + (f" ({within:.3f} within a benchmark)" if within is not None else "")
            + (f", 95% interval{_interval(ci, '{:.2f}')}" if ci else "")
            + "; a learned When that ranks below it has not learned more than how late a review comes.",
        ]
    by_features = reference.get("review_auroc_by_features")
    if by_features is not None:
        within = reference.get("review_auroc_by_features_within_env")
        lines.append(
            f"A logistic regression on the signals the prompt states (`eval/when_features.py`), fitted on "
            f"{reference['feature_train_rows']} train reviews, ranks them at AUROC {by_features:.3f}"
            + _interval(reference.get("review_auroc_by_features_ci95"), "{:.2f}")
            + (f" ({within:.3f} within a benchmark)" if within is not None else "")
            + ": the bar for a When that reads more than the prompt's surface."
        )
    return lines


def evaluate_controllers(cfg: ControllerEvalConfig) -> list[dict[str, Any]]:
    data = Path(cfg.data)
    if not (data / "review_sft").exists():
        raise UserInputError(f"{data} holds no review_sft dataset: build one with `rir build-data --out {data}`")
    check_versions(data, cfg.controller)
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
    every_locate = split_rows(data, "locate_sft", cfg.split, cfg.source)
    points = restore_points(every_locate, cap_rows(every_locate, cfg.max_rows, stratify=True))
    reference = step_reference(reviews) | feature_reference(train, reviews) | stay_reference(points)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"results": results, "reference": reference, "config": asdict(cfg)}
    (out / CONTROLLER_EVAL).write_text(json.dumps(record, indent=2) + "\n")
    (out / "controller_eval.md").write_text(markdown(results, cfg.split, cfg.source, reference))
    return results
