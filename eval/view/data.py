"""The page's data, built from typed records: each episode's timeline and branch tree, the index rows and
the side-by-side groups.

Everything here is plain JSON-able values (the page embeds them as JSON and draws them in the browser);
no HTML is made here, so nothing here needs escaping. The tree is laid out here, in SVG user units:
column = steps from the start (the checkpoint a node stands for), row = the branch that first reached it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from eval.paired import pairing_key
from eval.view.database import step_fields
from rir_runtime.decisions import Failure, Reflection
from rir_runtime.envs.checkpoints import Step
from rir_runtime.memory import MemorySnapshot
from rir_runtime.trace import (
    Branch,
    EpisodeRecord,
    Event,
    GuidanceEvent,
    LocateEvent,
    LocateFailedEvent,
    LocateFallbackEvent,
    ReflectEvent,
    ResetEvent,
    RespondEvent,
    RestoreEvent,
    RestoreFailedEvent,
    ReviewEvent,
    RollbackCallEvent,
    StepEvent,
    ToolErrorEvent,
    replay,
)

# Tree layout in SVG units: one column per step, one row per branch, a margin for the branch labels.
DX, DY, LEFT, TOP = 34, 46, 96, 28

# The index rows are arrays (10,000 episodes: keys would double the index); the page reads this header.
INDEX_COLUMNS = (
    "episode_id",
    "method",
    "controller",
    "method_key",
    "task",
    "env",
    "split",
    "variation",
    "seed",
    "success",
    "score",
    "env_steps",
    "rollbacks",
    "stop_reason",
    "group",
)


def number(value: float | None) -> float | None:
    """A float JSON can carry: None for NaN and infinities (a margin may be either)."""
    return None if value is None or not math.isfinite(value) else round(float(value), 4)


# --- the branch tree ------------------------------------------------------------------------------------
def branch_tree(branches: Sequence[Branch]) -> dict[str, Any]:
    """Nodes (the start and one per executed step), the edges between them, and one arrow per restore
    from the step a branch left back to the checkpoint it restored. Node n > 0 is the n-th step event
    of the episode in time order: every step after a restore grows a new branch."""
    nodes: list[dict[str, Any]] = [_node(0, 0, "")]
    edges: list[list[int]] = []
    restores: list[dict[str, Any]] = []
    owner: list[int] = [0]  # owner[t]: the node standing for checkpoint t on the current branch
    for row, branch in enumerate(branches):
        for step in branch.steps[len(owner) - 1 :]:
            nodes.append(_node(step.index + 1, row, _flag(step)))
            edges.append([owner[-1], len(nodes) - 1])
            owner.append(len(nodes) - 1)
        if branch.restore_to is not None:
            to = min(branch.restore_to, len(owner) - 1)
            restores.append({"from": owner[-1], "to": owner[to], "from_t": len(owner) - 1, "to_t": to, "row": row})
            owner = owner[: to + 1]
    for arrow in restores:  # the first step of the branch the restore started (None: it took none)
        arrow["next"] = next((i for i, n in enumerate(nodes) if n["row"] == arrow["row"] + 1), None)
    rows = [{"label": _row_label(i, b, branches), "y": TOP + DY * i} for i, b in enumerate(branches)]
    width = LEFT + DX * (max(n["t"] for n in nodes) + 1)
    return {"nodes": nodes, "edges": edges, "restores": restores, "rows": rows, "width": width,
            "height": TOP + DY * len(branches)}  # fmt: skip


def _node(t: int, row: int, flag: str) -> dict[str, Any]:
    """A node at checkpoint t of a branch row; `ev` (its step event) and `review` are set by `timeline`."""
    node: dict[str, Any] = {"t": t, "row": row, "x": LEFT + DX * t, "y": TOP + DY * row, "ev": -1}
    if flag:
        node["flag"] = flag
    return node


def _flag(step: Step | StepEvent) -> str:
    """How a step is drawn: won, lost, the injected error (ground truth), or plain."""
    if step.won:
        return "won"
    if step.lost:
        return "lost"
    return "error" if step.injected_error else ""


def _row_label(row: int, branch: Branch, branches: Sequence[Branch]) -> str:
    start = "start" if row == 0 else f"from t={branches[row - 1].restore_to}"
    end = f"restored to t={branch.restore_to}" if branch.ended_by == "restore" else branch.ended_by
    return f"branch {row + 1}: {start}, {end}"


# --- the timeline -----------------------------------------------------------------------------------------
def timeline(record: EpisodeRecord, tree: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event in order as a flat object for the page; marks the tree's nodes with their step event
    (a node's action is its event's) and the decision of a review held there."""
    nodes, arrows = tree["nodes"], iter(tree["restores"])
    here, steps, rows = 0, 0, []
    for i, event in enumerate(record.events):
        if isinstance(event, StepEvent):
            steps += 1
            here = steps if steps < len(nodes) else here
            nodes[here]["ev"] = i
        elif isinstance(event, RestoreEvent) and event.k > 0:
            here = next(arrows, {"to": here})["to"]
        elif isinstance(event, ReviewEvent) and nodes[here].get("review") != "recover":
            nodes[here]["review"] = event.decision
        rows.append({"kind": event.type, "t": event.t, **event_fields(event), **step_fields(record.env, event)})
    return rows


def event_fields(event: Event) -> dict[str, Any]:
    """The fields the page shows for one event; an event kind this viewer does not know shows its fields
    as text (a newer trace schema still renders)."""
    convert = _CONVERTERS.get(type(event))
    if convert is not None:
        return convert(event)
    return {"fields": [[f.name, str(getattr(event, f.name))] for f in fields(event) if f.name != "t"]}


def _reset(e: ResetEvent) -> dict[str, Any]:
    return {"observation": e.observation, "objective": e.objective, "max_score": number(e.max_score)}


def _step(e: StepEvent) -> dict[str, Any]:
    flag = _flag(e)
    return {
        "action": e.action,
        "observation": e.observation,
        "score": number(e.score),
        **({"flag": flag} if flag else {}),
    }


def _review(e: ReviewEvent) -> dict[str, Any]:
    return {"trigger": e.trigger, "decision": e.decision, "reason": e.reason, "margin": number(e.margin)}


def _locate(e: LocateEvent) -> dict[str, Any]:
    return {"segments": [list(s) for s in e.segments], "segment": e.segment, "step": e.step}


def _reflect(e: ReflectEvent) -> dict[str, Any]:
    return {"restore_point": e.restore_point, "reflection": reflection(e.reflection), "memory": memory(e.memory),
            "fallback": e.fallback, "budget_spent": e.budget_spent}  # fmt: skip


def _restore(e: RestoreEvent) -> dict[str, Any]:
    return {"to": e.to, "k": e.k, "first_error": e.first_error}


def _guidance(e: GuidanceEvent) -> dict[str, Any]:
    return {"mode": e.mode, "warned": list(e.warned), "reasons": list(e.reasons), "penalty": number(e.penalty),
            "unguided": e.unguided, "chosen": e.chosen, "changed": e.changed,
            "scores": [number(s) for s in e.scores]}  # fmt: skip


_CONVERTERS: dict[type[Event], Callable[[Any], dict[str, Any]]] = {
    ResetEvent: _reset,
    StepEvent: _step,
    ReviewEvent: _review,
    LocateEvent: _locate,
    ReflectEvent: _reflect,
    RestoreEvent: _restore,
    GuidanceEvent: _guidance,
    RespondEvent: lambda e: {"text": e.text},
    RollbackCallEvent: lambda e: {"reason": e.reason, "target": e.target},
    ToolErrorEvent: lambda e: {"message": e.message},
    LocateFailedEvent: lambda e: {"error": e.error},
    LocateFallbackEvent: lambda e: {"asked": e.asked},
    RestoreFailedEvent: lambda e: {"to": e.to, "error": e.error},
}


def reflection(r: Reflection) -> dict[str, Any]:
    failure = r.failure
    return {
        "env_knowledge": list(r.env_knowledge),
        "milestones": list(r.milestones),
        "failure": None if failure is None else _failure(failure),
    }


def memory(m: MemorySnapshot) -> dict[str, Any]:
    """The memory as the page lists it; an anchored entry keeps its prefix's length and last action only
    (the full prefix repeats the branch, and every reflection would carry it again)."""
    return {
        "env_knowledge": list(m.env_knowledge),
        "milestones": list(m.milestones),
        "failures": [_failure(f) for f in m.failures],
        "notes": list(m.notes),
        "anchored": [
            {
                "action": a.action,
                "source": a.source,
                "prefix_len": len(a.prefix),
                "after": a.prefix[-1] if a.prefix else "",
            }
            for a in m.anchored
        ],
    }


def _failure(f: Failure) -> dict[str, str]:
    return {"condition": f.condition, "action": f.action, "outcome": f.outcome, "lesson": f.lesson}


# --- one episode, the index, the groups ---------------------------------------------------------------------
def actions(record: EpisodeRecord) -> list[str]:
    """The actions the episode executed, in time order (abandoned branches included)."""
    return [e.action for e in record.events if isinstance(e, StepEvent)]


def episode_view(record: EpisodeRecord, index: int, group: int) -> dict[str, Any]:
    """Everything the episode page draws for one record."""
    played = replay(record)
    tree = branch_tree(played.branches)
    events = timeline(record, tree)
    return {
        "i": index,
        "group": group,
        "meta": meta(record),
        "objective": played.objective,  # the first observation is the reset event's
        "tree": tree,
        "events": events,
        # Where in the executed actions (`actions`) a branch starts after a restore, and from which checkpoint.
        "restarts": [[r["next"] - 1, r["to_t"]] for r in tree["restores"] if r["next"] is not None],
    }


# Record fields shown when the record has them (the controller's accounting changes between schemas).
_OPTIONAL = (
    ("controller calls", "controller_calls"),
    ("controller decisions", "controller_decisions"),
    ("controller model calls", "controller_model_calls"),
    ("controller seconds", "controller_seconds"),
    ("controller charged to B_agent", "charge_controller"),
    ("tag", "tag"),
)


def meta(record: EpisodeRecord) -> list[list[Any]]:
    """The header table of an episode page: (label, value) pairs; None shows as "-" (not recorded)."""
    budget = getattr(record, "budget_agent_spec", "") or str(getattr(record, "budget_agent", ""))
    pairs: list[tuple[str, Any]] = [
        ("episode", record.episode_id),
        ("env", record.env),
        ("task", record.task),
        ("split", record.split),
        ("variation", record.variation),
        ("seed", getattr(record, "seed", 0)),
        ("method", record.method),
        ("controller", record.controller),
        ("policy", record.policy),
        ("budgets (agent / rollback)", f"{budget} / {getattr(record, 'budget_rollback', '')}"),
        ("outcome", "success" if record.success else "failure"),
        ("stop reason", record.stop_reason),
        ("score", number(record.score)),
        ("env steps", record.env_steps),
        ("agent calls", record.agent_calls),
        ("recoveries (rollbacks)", f"{record.recoveries} ({record.rollbacks})"),
        ("parse failures", record.parse_failures),
        ("first injected error", None if record.first_error_step is None else f"t={record.first_error_step + 1}"),
    ]
    pairs += [(label, getattr(record, name)) for label, name in _OPTIONAL if hasattr(record, name)]
    return [[k, _shown(v)] for k, v in pairs if v != ""]


def _shown(value: Any) -> Any:
    """None (not recorded) as "-", a flag as yes / no, a float rounded."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return number(value) if isinstance(value, float) else value


def index_row(record: EpisodeRecord, group: int) -> list[Any]:
    """One row of the index, in `INDEX_COLUMNS` order."""
    return [record.episode_id, record.method, record.controller, record.method_key, record.task, record.env,
            record.split, record.variation, getattr(record, "seed", 0), record.success, number(record.score),
            record.env_steps, record.rollbacks, record.stop_reason, group]  # fmt: skip


def first_difference(sequences: Sequence[Sequence[str]]) -> int | None:
    """The first index at which the sequences do not all agree (one that has ended disagrees with one
    that goes on); None when they are all the same, or there is only one."""
    if len(sequences) < 2:
        return None
    for i in range(max(len(s) for s in sequences)):
        if len({s[i] if i < len(s) else None for s in sequences}) > 1:
            return i
    return None


def groups(records: Sequence[EpisodeRecord]) -> tuple[list[int], list[dict[str, Any]]]:
    """Each record's group (the same episode: env, task, split, variation, seed and budgets) and the
    groups: their members (by method key) and where their action sequences first differ."""
    by_key: dict[Any, list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        by_key[pairing_key(record)].append(i)
    of = [0] * len(records)
    out = []
    for g, members in enumerate(by_key.values()):
        members.sort(key=lambda i: (records[i].method_key, records[i].episode_id))
        for i in members:
            of[i] = g
        out.append({"members": members, "first_diff": first_difference([actions(records[i]) for i in members])})
    return of, out
