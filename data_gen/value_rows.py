"""The value controller's training pairs: for one labelled decision point, its options ranked by their
hindsight values, as (prompt, chosen option, rejected option) rows for TRL's `RewardTrainer`.

A point's options are {continue} (at a scheduled or requested review; after a failed ending there is
nothing to continue) and {recover to checkpoint i with the lesson for step i} for every admissible
checkpoint (`rir_runtime/controllers/options.py`). An option's value is the label's: `v_now` for continuing,
`V(C_i)` for a recovery to i. Two options make a pair where their values differ by at least the review
margin (0.5): a smaller difference is noise in K continuations, not a preference. Options of equal
value are ordered as the controller breaks ties (going on, then the latest checkpoint): on a branch
where every recovery is worth what going on is, that is the only lesson, and without it the model
would learn only that going on loses. Each point gives at most `pairs_per_point` pairs, the best
option against the worse ones nearest to it first (the step before or after the culprit is the hard
negative; a far one teaches little), then against its ties, so long branches do not drown short ones.

Values must be known for the options they rank. `V_expert` only falls along a branch, so a
bisection's unprobed checkpoints take the next probed value (`complete_values`); `V_agent` with the
lesson kept does not (the one step to blame is a spike, not a step down), so there only measured
checkpoints are options: build such data with `--no_bisect`.
"""

from __future__ import annotations

import json
from typing import Any

from data_gen.hindsight import RECOVER_MARGIN, context_for
from data_gen.points import DecisionPoint, ended
from rir_runtime.controllers.options import option_text, value_prompt
from rir_runtime.values import complete_values

VALUE_DATASET = "value_pref"
DEFAULT_PAIRS_PER_POINT = 8


def option_values(point: DecisionPoint, label: dict[str, Any], monotone: bool) -> dict[int | None, float]:
    """{option: value}: None (continue, where the branch has not ended) and each admissible checkpoint
    whose value is known (measured, or implied where `monotone`)."""
    measured = {int(k): float(v) for k, v in label["values"].items()}
    admissible = list(context_for(point).admissible)
    known = complete_values(measured, admissible).values if monotone else measured
    values: dict[int | None, float] = {i: known[i] for i in admissible if i in known}
    if not ended(point):
        values[None] = float(label["v_now"])
    return values


def tie_order(option: int | None) -> int:
    """Among options of equal value, the controller's preference: going on (free), then the latest
    checkpoint (it keeps the most progress)."""
    return 1 << 30 if option is None else option


def ranked_pairs(values: dict[int | None, float], limit: int) -> list[tuple[int | None, int | None]]:
    """(better, worse) options, at most `limit`: the best option against every option at least the
    margin worse, the hardest first, then against the options its value ties with, so that where no
    recovery is worth more than going on the model learns to go on (and to keep the later of two
    equal restore points) instead of being taught nothing there."""
    if not values:
        return []
    top = max(values.values())
    best = max((o for o, v in values.items() if v == top), key=tie_order)
    worse = [o for o, v in values.items() if top - v >= RECOVER_MARGIN]
    tied = [o for o, v in values.items() if v == top and o != best]

    def hardness(o: int | None) -> tuple[int, ...]:
        if o is None:
            return (0,)  # going on where a recovery wins: the When's contrast
        if best is None:
            return (1, -o)  # recovering where going on wins or ties: the latest first
        return (1, abs(o - best), -o)  # another checkpoint: the nearest to the right one first

    ranked = sorted(worse, key=hardness) + sorted(tied, key=hardness)
    return [(best, o) for o in ranked][:limit]


def value_rows(
    point: DecisionPoint, label: dict[str, Any], meta: dict[str, Any], monotone: bool, limit: int
) -> list[dict[str, Any]]:
    """The point's preference rows: plain-text prompt and options (the value model reads text, not chat)."""
    values = option_values(point, label, monotone)
    pairs = ranked_pairs(values, limit)
    if not pairs:
        return []
    ctx = context_for(point)
    prompt = value_prompt(ctx)
    table = json.dumps({"continue" if o is None else str(o): v for o, v in values.items()})
    rows = []
    for better, worse in pairs:
        rows.append(
            {
                "prompt": prompt,
                "chosen": option_text(ctx, better),
                "rejected": option_text(ctx, worse),
                "meta": {
                    **meta,
                    "decision": "value",
                    "label": f"{values[better]:.2f}>{values[worse]:.2f}",
                    "context": ctx.to_json(),
                    "option_values": table,
                    "chosen_option": -1 if better is None else better,
                    "rejected_option": -1 if worse is None else worse,
                },
            }
        )
    return rows
