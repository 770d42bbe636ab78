"""Training rows from one labelled decision point, in TRL's conversational formats.

A preference pair differs only in what is judged: both review answers give the same reason (the
evidence the prompt shows), locate pairs set two answers the same prompt offers against each
other, and reflect pairs set two informative reflections against each other. Review and locate rows
keep their hindsight values in `meta.values` (checkpoint -> V, JSON) and `meta.v_now`; reflect rows
keep each candidate's retry success in `meta.retry_success`. Prompts come from
`rir_runtime.prompts.fit_decision`, the renderer the controllers use at inference.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from data_gen.hindsight import context_for
from data_gen.points import DecisionPoint
from rir_runtime.controllers import failure_signal
from rir_runtime.decisions import DecisionKind, Reflection, Review, ReviewDecision, dump, parse
from rir_runtime.orchestration.jobs import EpisodeJob
from rir_runtime.prompts import DecisionContext, Messages, approx_tokens

Fit = Callable[[DecisionKind, DecisionContext], Messages]  # renders a decision prompt within the token bound


NO_SIGNAL = "no visible failure signal"
Row = tuple[str, dict[str, Any]]  # (dataset name, row)


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _values_meta(label: dict[str, Any]) -> dict[str, Any]:
    """The hindsight values as measured (checkpoint index -> V, as JSON so Arrow keeps one column
    type) and V(now), so a row's preference can be checked without re-executing the branch."""
    values = {str(k): v for k, v in sorted(label["values"].items(), key=lambda kv: int(kv[0]))}
    return {"values": json.dumps(values), "v_now": float(label["v_now"])}


def review_reason(ctx: DecisionContext) -> str:
    """The reason both review answers give: evidence the prompt shows, never hindsight the model
    cannot see, and the same text whichever the decision, so only the decision tells them apart."""
    signal = failure_signal(ctx)
    return signal.text if signal else NO_SIGNAL


def review_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """One SFT row (the hindsight decision) and one pair (it against the other decision). None for
    a terminal review: the runtime recovers after a failed ending without asking the When."""
    if point.trigger == "terminal":
        return []
    ctx = context_for(point)
    prompt = fit("review", ctx)
    reason = review_reason(ctx)
    decision = label["review"]
    other: ReviewDecision = "continue" if decision == "recover" else "recover"
    good = _assistant(dump("review", Review(decision, reason)))
    bad = _assistant(dump("review", Review(other, reason)))
    meta = {**meta, "label": decision, "context": ctx.to_json(), **_values_meta(label)}
    return [
        ("review_sft", {"prompt": prompt, "completion": good, "meta": meta}),
        ("review_pref", {"prompt": prompt, "chosen": good, "rejected": bad, "meta": meta}),
    ]


def rejected_alternative(right: int, controller_pick: int | None, choices: Sequence[int]) -> int | None:
    """A wrong answer among those the prompt offers (segments or checkpoints): the controller's own
    pick when it was wrong, else the nearest other choice, later first. A later one lies past the
    harmful step (lower V, as V only falls along a branch); an earlier one has no higher V and keeps
    less progress. An answer the prompt does not offer would be a give-away, not a preference."""
    others = sorted((i for i in choices if i != right), key=lambda i: (abs(i - right), i < right))
    if controller_pick in others:
        return controller_pick
    return others[0] if others else None


def _locate_answer(kind: DecisionKind, prompt: Messages, right: int, wrong: int | None, meta: dict) -> list[Row]:
    chosen = _assistant(dump(kind, right))
    rows: list[Row] = [("locate_sft", {"prompt": prompt, "completion": chosen, "meta": meta})]
    if wrong is not None:
        pair = {"prompt": prompt, "chosen": chosen, "rejected": _assistant(dump(kind, wrong)), "meta": meta}
        rows.append(("locate_pref", pair))
    return rows


def locate_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """Where a recovery happens (in hindsight, or by the rollout's own controller): the coarse
    (segment) and fine (checkpoint) answers of the restore label, each as an SFT row and as a pair
    against a worse answer the same prompt offers.

    A recovery the rollout's controller made where hindsight says "continue" is kept: its restore
    label is the current checkpoint (stay, k = 0), the answer for a looping but still winnable
    branch. Without these rows the Where never sees staying and always spends a rollback."""
    r, seg = label["restore"], label["segment"]
    recovered = label["review"] == "recover" or point.chosen_step is not None
    if not recovered or r is None:
        return []
    segs = tuple(tuple(s) for s in label["segments"])
    meta = {**meta, **_values_meta(label), "restore": r}
    pick = point.chosen_step
    pick_segment = next((i for i, (a, b) in enumerate(segs) if pick is not None and a <= pick < b), None)
    ctx_c = context_for(point, "locate", segments=segs)
    meta_c = {**meta, "label": str(seg), "decision": "locate_coarse", "context": ctx_c.to_json()}
    wrong_segment = rejected_alternative(seg, pick_segment, range(len(segs)))
    rows = _locate_answer("locate_coarse", fit("locate_coarse", ctx_c), seg, wrong_segment, meta_c)
    ctx_f = context_for(point, "locate", segments=segs, segment=segs[seg])
    meta_f = {**meta, "label": str(r), "decision": "locate_fine", "context": ctx_f.to_json()}
    a, b = segs[seg]
    wrong_step = rejected_alternative(r, pick, [i for i in ctx_f.admissible if a <= i < b])
    return rows + _locate_answer("locate_fine", fit("locate_fine", ctx_f), r, wrong_step, meta_f)


def reflect_rows(point: DecisionPoint, label: dict[str, Any], fit: Fit, meta: dict[str, Any]) -> list[Row]:
    """The reflection with the best retry success as the SFT target, and a pair of it against each
    non-empty candidate that did strictly worse (ties teach nothing; a pair against the empty
    reflection would teach "write something" rather than what to write, so it is measured, not paired)."""
    if not label["reflections"]:
        return []
    candidates = [(parse("reflect", json.dumps(c)) if c else Reflection(), rate) for c, rate in label["reflections"]]
    ranked = sorted(candidates, key=lambda x: -x[1])  # stable: hindsight before "none" on ties
    best, top = ranked[0]
    chosen = _assistant(dump("reflect", best))
    ctx_r = context_for(point, "reflect", restore_point=label["restore"])
    prompt = fit("reflect", ctx_r)
    rates = json.dumps([[c.to_json(), rate] for c, rate in candidates])
    meta = {**meta, "decision": "reflect", "context": ctx_r.to_json(), "retry_success": rates}
    rows: list[Row] = [
        ("reflect_sft", {"prompt": prompt, "completion": chosen, "meta": {**meta, "label": f"{top:.2f}"}})
    ]
    for worse, rate in ranked[1:]:
        if rate < top and worse != Reflection():
            pair = {"prompt": prompt, "chosen": chosen, "rejected": _assistant(dump("reflect", worse))}
            rows.append(("reflect_pref", {**pair, "meta": {**meta, "label": f"{top:.2f}>{rate:.2f}"}}))
    return rows


def point_meta(point: DecisionPoint) -> dict[str, Any]:
    """What every row of a decision point says of where it comes from: the episode, and the job and
    review index that run it to this decision again (online GRPO branches from there)."""
    ep = point.record
    return {
        "env": ep.env,
        "task": ep.task,
        "split": ep.split,
        "variation": ep.variation,
        "episode_id": ep.episode_id,
        "step": len(point.history),
        "source_run": point.source_run,
        "decision": "review",
        "job": EpisodeJob.of_record(ep, run_config(point.source_run)).to_json(),
        "review_index": point.review.index,
    }


@functools.cache
def run_config(source_run: str) -> dict[str, Any]:
    """The selection a rollout folder was run with (its run.json), empty where there is none."""
    path = Path(source_run) / "run.json"
    return dict(json.loads(path.read_text()).get("config", {})) if source_run and path.is_file() else {}


def rows_for(point: DecisionPoint, label: dict[str, Any], fit: Fit) -> dict[str, list[dict[str, Any]]]:
    """All SFT and preference rows one labelled decision point yields."""
    meta = point_meta(point)
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for make in (review_rows, locate_rows, reflect_rows):
        for name, row in make(point, label, fit, meta):
            rows[name].append(row)
    return rows


def token_counter(tokenizer_name: str) -> Any:
    if not tokenizer_name:
        return approx_tokens
    from rir_runtime.llm.registry import load_tokenizer

    tok = load_tokenizer(tokenizer_name)

    def count(messages: Messages) -> int:
        encoded = tok.apply_chat_template(messages, tokenize=True)
        # transformers >= 5 returns a BatchEncoding, whose len() is its number of fields
        return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    return count
