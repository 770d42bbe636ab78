"""Where a real agent's mistakes come from, and whether the restores landed before them.

    rir mistakes --run runs/eval/agent-textworld      (or a rollout folder)

For every branch of every episode (each branch abandoned by a restore, and the last one) the
action sequence is re-executed and its *first fatal step* found in hindsight: the step after
which the environment's expert can no longer win (`ValueProbe`, the oracle's value, by
bisection). A failed branch gets a category: the fatal action's kind, or, when no step was fatal,
whether the agent looped or ran out of budget on track. A restore *landed before* the mistake when
its restore point is at or before the abandoned branch's first fatal step.

Where the expert only knows its gold path (ScienceWorld, `expert_replans = False`), any deviation
would read as fatal, so there the outcome decides instead: a lost branch blames its last action,
and a restore landed before the mistake when it lies before that action.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from data_gen.hindsight import branch_snapshots
from rir_runtime.envs import Env, TaskSpec, make_env
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import RestoreError, UserInputError
from rir_runtime.trace import Branch, Event, ReflectEvent, RestoreEvent, StepEvent, read_records, replay
from rir_runtime.values import ValueProbe, latest_best_bisect

# The fatal action's first word names the mistake (TextWorld cooking and ScienceWorld verbs).
VERB_CATEGORIES = {
    "focus": "focused on the wrong thing",
    "eat": "ate the meal unprepared",
    "prepare": "prepared the meal early",
    "slice": "wrong cut",
    "dice": "wrong cut",
    "chop": "wrong cut",
    "cook": "wrong cooking",
    "drop": "dropped something needed",
    "put": "put something away",
    "insert": "put something away",
    "take": "took the wrong item",
    "pick": "took the wrong item",
    "move": "moved the wrong thing",
}


LANDED_BEFORE, LANDED_AFTER = "landed at or before the fatal step", "landed after it"
NO_FATAL_STEP = "no fatal step in the abandoned branch"


@dataclass
class MistakeReport:
    categories: Counter = field(default_factory=Counter)
    restores: Counter = field(default_factory=Counter)  # (method/controller, where the restore landed)
    examples: dict[str, str] = field(default_factory=dict)
    after_restore: Counter = field(default_factory=Counter)  # (method/controller, what the agent did next)


def after_restores(parts: Sequence[Branch]) -> Counter:
    """What the agent did at each restore point: the abandoned branch's action again, or another.
    A greedy agent in a restored state repeats itself unless its memory changes its mind, so this
    measures whether the memory is read at all."""
    out: Counter = Counter()
    for old, new in pairwise(parts):
        r = old.restore_to
        if r is not None and r < len(old.steps) and r < len(new.steps):
            out["the abandoned action again" if new.actions[r] == old.actions[r] else "another action"] += 1
    return out


def after_stays(events: Sequence[Event]) -> Counter:
    """The same for recoveries that keep the state (k = 0, or a restore to the current step): is the
    agent's next action the one the reflection just blamed?"""
    out: Counter = Counter()
    blamed, waiting = None, False
    for event in events:
        if isinstance(event, ReflectEvent):
            blamed = event.reflection.failure.action if event.reflection.failure else None
        elif isinstance(event, RestoreEvent):
            waiting = event.k == 0 and blamed is not None
        elif isinstance(event, StepEvent) and waiting:
            out["the blamed action again (k = 0)" if event.action == blamed else "another action (k = 0)"] += 1
            waiting = False
    return out


def first_fatal_step(env: Env, task: TaskSpec, steps: tuple[Step, ...], probe: ValueProbe) -> int | None:
    """The index of the step after which the expert cannot win any more; None when no step was
    fatal. Raises `Unwinnable` when the expert cannot win even from the start, and `RestoreError`
    when re-executing the branch does not reproduce its recorded observations."""
    snapshots, _ = branch_snapshots(env, task, steps)
    values: dict[int, float] = {}

    def value(i: int) -> float:  # each probe re-runs the expert: never twice for one checkpoint
        if i not in values:
            values[i] = probe.value(snapshots[i])
        return values[i]

    if value(0) == 0:
        raise Unwinnable(task.key)
    last_good, _ = latest_best_bisect(list(range(len(snapshots))), value)
    return last_good if last_good < len(snapshots) - 1 else None


class Unwinnable(Exception):
    """The expert fails from the initial state: no step of the agent can be blamed."""


def categorize(actions: list[str], fatal: int | None) -> str:
    if fatal is not None:
        verb = actions[fatal].split()[0]
        return VERB_CATEGORIES.get(verb, f"fatal '{verb}'")
    recent = actions[-8:]
    # The same action three times at the end (the heuristic's loop signal also wants the same
    # reply each time); a cycle ("take x / put x") repeats each of its actions too, but is the
    # next category.
    if len(recent) >= 3 and len(set(recent[-3:])) == 1:
        return "no fatal step: looped on one action"
    if len(recent) >= 4 and len(set(recent)) <= len(recent) // 2:
        return "no fatal step: went back and forth"
    return "no fatal step: ran out of budget on track"


def lost_step(steps: tuple[Step, ...]) -> int | None:
    """Outcome-based blame for gold-path-only experts: the recorded step that lost the episode."""
    return next((s.index for s in steps if s.lost), None)


def analyse(run: Path) -> MistakeReport:
    paths = sorted(run.glob("episodes*.jsonl"))  # rir eval writes one file; rollout shards one each
    if not paths:
        raise UserInputError(f"{run}/episodes.jsonl does not exist: pass --run <folder written by rir eval or rollout>")
    report = MistakeReport()
    envs: dict[str, Env] = {}
    try:
        for record in (r for path in paths for r in read_records(path)):
            env = envs.get(record.env) or envs.setdefault(record.env, make_env(record.env))
            parts = replay(record).branches
            who = record.method_key  # the controller chose the restore points: compare them apart
            for what, n in (after_restores(parts) + after_stays(record.events)).items():
                report.after_restore[(who, what)] += n
            for branch in parts:
                if branch.ended_by != "won":
                    _file_branch(report, env, record.task_spec, branch, who)
    finally:
        for env in envs.values():
            env.close()
    return report


def _file_branch(report: MistakeReport, env: Env, task: TaskSpec, branch: Branch, who: str) -> None:
    """Count one branch that did not win: where its restore landed, or why it failed."""
    try:
        fatal = (
            first_fatal_step(env, task, branch.steps, ValueProbe(env))
            if env.expert_replans
            else lost_step(branch.steps)
        )
    except (Unwinnable, RestoreError) as err:
        reason = (
            "expert cannot win from the start"
            if isinstance(err, Unwinnable)
            else "re-execution diverged from the record"
        )
        report.categories[reason] += 1
        report.examples.setdefault(reason, task.key)
        return
    if branch.ended_by == "restore":
        assert branch.restore_to is not None
        landed = NO_FATAL_STEP if fatal is None else (LANDED_BEFORE if branch.restore_to <= fatal else LANDED_AFTER)
        report.restores[(who, landed)] += 1
        return
    category = categorize(branch.actions, fatal)
    report.categories[category] += 1
    where = f"step {fatal} '{branch.actions[fatal]}'" if fatal is not None else " / ".join(branch.actions[-4:])
    report.examples.setdefault(category, f"{task.key}: {where}")


def markdown(report: MistakeReport, run: Path) -> str:
    lines = [
        f"# Mistakes in {run}",
        "",
        "Failed episodes by the first fatal step of their final branch:",
        "",
        "| category | episodes | example |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {c} | {n} | {report.examples[c]} |" for c, n in report.categories.most_common()]
    landings = (LANDED_BEFORE, LANDED_AFTER, NO_FATAL_STEP)
    lines += [
        "",
        "Restores, against the first fatal step of the branch they abandoned:",
        "",
        "| method / controller | " + " | ".join(landings) + " |",
        "| --- |" + " ---: |" * len(landings),
    ]
    lines += [
        f"| {m} | " + " | ".join(str(report.restores[(m, c)]) for c in landings) + " |"
        for m in sorted({m for m, _ in report.restores})
    ] or ["| (no restores) |" + " 0 |" * len(landings)]
    if report.after_restore:
        methods = sorted({m for m, _ in report.after_restore})
        kinds = [
            "the abandoned action again",
            "another action",
            "the blamed action again (k = 0)",
            "another action (k = 0)",
        ]
        lines += [
            "",
            "The agent's next action after each recovery (does the kept memory change it?):",
            "",
            "| method / controller | " + " | ".join(kinds) + " |",
            "| --- |" + " ---: |" * len(kinds),
        ]
        lines += [f"| {m} | " + " | ".join(str(report.after_restore[(m, k)]) for k in kinds) + " |" for m in methods]
    return "\n".join(lines) + "\n"


def main(run: str) -> int:
    text = markdown(analyse(Path(run)), Path(run))
    (Path(run) / "mistakes.md").write_text(text)
    sys.stdout.write(text)
    return 0
