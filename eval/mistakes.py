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

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rir_runtime.envs import TaskSpec, make_env
from rir_runtime.errors import UserInputError
from rir_runtime.values import ValueProbe, latest_best_bisect

# The fatal action's first word names the mistake (TextWorld cooking and ScienceWorld verbs).
VERB_CATEGORIES = {
    "focus": "focused on the wrong thing", "eat": "ate the meal unprepared", "prepare": "prepared the meal early",
    "slice": "wrong cut", "dice": "wrong cut", "chop": "wrong cut", "cook": "wrong cooking",
    "drop": "dropped something needed", "put": "put something away", "insert": "put something away",
    "take": "took the wrong item", "pick": "took the wrong item", "move": "moved the wrong thing",
}


@dataclass
class Branch:
    actions: list[str]
    ended_by: str  # "restore", "won", "lost", or the episode's stop reason
    restore_to: int | None = None


@dataclass
class MistakeReport:
    categories: Counter = field(default_factory=Counter)
    restores: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)


def branches(events: list[dict[str, Any]], stop_reason: str) -> list[Branch]:
    """Split an episode's event log into branches: a restore to r abandons the actions after r."""
    out: list[Branch] = []
    actions: list[str] = []
    for event in events:
        if event["type"] == "step":
            actions.append(event["action"])
        elif event["type"] == "restore" and event.get("k", 0) > 0:
            out.append(Branch(list(actions), "restore", event["to"]))
            actions = actions[: event["to"]]
    out.append(Branch(actions, stop_reason))
    return out


def first_fatal_step(env: Any, task: TaskSpec, actions: list[str], probe: ValueProbe) -> int | None:
    """The index of the step after which the expert cannot win any more; None when no step was
    fatal. Raises `Unwinnable` when the expert cannot win even from the start."""
    env.reset(task)
    snapshots = [env.checkpoint()]
    for action in actions:
        result = env.step(action)
        snapshots.append(env.checkpoint())
        if result.done:
            break
    if probe.value(snapshots[0]) == 0:
        raise Unwinnable(task.key)
    last_good, _ = latest_best_bisect(list(range(len(snapshots))), lambda i: probe.value(snapshots[i]))
    return last_good if last_good < len(snapshots) - 1 else None


class Unwinnable(Exception):
    """The expert fails from the initial state: no step of the agent can be blamed."""


def categorize(actions: list[str], fatal: int | None) -> str:
    if fatal is not None:
        verb = actions[fatal].split()[0]
        return VERB_CATEGORIES.get(verb, f"fatal '{verb}'")
    recent = actions[-8:]
    if recent and Counter(recent).most_common(1)[0][1] >= 3:
        return "no fatal step: looped on one action"
    if len(recent) >= 4 and len(set(recent)) <= len(recent) // 2:
        return "no fatal step: went back and forth"
    return "no fatal step: ran out of budget on track"


def lost_step(env: Any, task: TaskSpec, actions: list[str]) -> int | None:
    """Outcome-based blame for gold-path-only experts: the action that lost the episode, if any."""
    env.reset(task)
    for i, action in enumerate(actions):
        result = env.step(action)
        if result.done:
            return i if result.lost else None
    return None


def analyse(run: Path) -> MistakeReport:
    paths = sorted(run.glob("episodes*.jsonl"))  # rir eval writes one file; rollout shards one each
    if not paths:
        raise UserInputError(f"{run}/episodes.jsonl does not exist: pass --run <folder written by rir eval or rollout>")
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    report, envs = MistakeReport(), {}
    try:
        for rec in records:
            env = envs.get(rec["env"]) or envs.setdefault(rec["env"], make_env(rec["env"]))
            task = TaskSpec(rec["env"], rec["task"], rec["split"], rec["variation"])
            probe = ValueProbe(env)
            for branch in branches(rec["events"], rec["stop_reason"]):
                if branch.ended_by == "won":
                    continue
                try:
                    fatal = (first_fatal_step(env, task, branch.actions, probe) if env.expert_replans
                             else lost_step(env, task, branch.actions))
                except Unwinnable:
                    report.categories["expert cannot win from the start"] += 1
                    report.examples.setdefault("expert cannot win from the start", task.key)
                    continue
                category = categorize(branch.actions, fatal)
                if branch.ended_by == "restore":
                    landed = "no fatal step in the abandoned branch" if fatal is None else (
                        "landed at or before the fatal step" if branch.restore_to <= fatal else "landed after it")
                    report.restores[landed] += 1
                else:
                    report.categories[category] += 1
                    report.examples.setdefault(category, f"{task.key}: " + (
                        f"step {fatal} '{branch.actions[fatal]}'" if fatal is not None else
                        " / ".join(branch.actions[-4:])))
    finally:
        for env in envs.values():
            env.close()
    return report


def markdown(report: MistakeReport, run: Path) -> str:
    lines = [f"# Mistakes in {run}", "", "Failed episodes by the first fatal step of their final branch:", "",
             "| category | episodes | example |", "| --- | ---: | --- |"]
    lines += [f"| {c} | {n} | {report.examples[c]} |" for c, n in report.categories.most_common()]
    lines += ["", "Restores, against the first fatal step of the branch they abandoned:", "",
              "| restore | count |", "| --- | ---: |"]
    lines += [f"| {c} | {n} |" for c, n in report.restores.most_common()] or ["| (no restores) | 0 |"]
    return "\n".join(lines) + "\n"


def main(run: str) -> int:
    text = markdown(analyse(Path(run)), Path(run))
    (Path(run) / "mistakes.md").write_text(text)
    sys.stdout.write(text)
    return 0
