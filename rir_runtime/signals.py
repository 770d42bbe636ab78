"""What a trajectory shows on its face: error replies, score changes, repeats, time since progress.

The heuristic controller decides from these signals, and the controller prompt states them, so a
small model reads in one line what it would otherwise have to infer from thirty steps.
"""

from __future__ import annotations

import re
from collections import Counter

from rir_runtime.envs.checkpoints import Step

ERROR_OBSERVATION = re.compile(
    r"nothing happens|not possible|can't|cannot|don't understand|no known action|"
    r"unknown|not recognized|ambiguous",
    re.IGNORECASE,
)


def is_error_reply(observation: str) -> bool:
    return bool(ERROR_OBSERVATION.search(observation))


def steps_since_progress(history: tuple[Step, ...]) -> int:
    """Steps taken since the score last rose (the whole branch when it never did)."""
    best, since = 0.0, 0
    for step in history:
        since = 0 if step.score > best else since + 1
        best = max(best, step.score)
    return since


RECENT_WINDOW = 8  # the recent steps whose repeated actions the prompt reports


def trajectory_signals(history: tuple[Step, ...], window: int = RECENT_WINDOW) -> list[str]:
    """The visible facts about a branch, one short phrase each (empty for an uneventful one)."""
    if not history:
        return []
    out = []
    scores = [f"{s.score:g} at step {s.index}" for i, s in enumerate(history) if s.score != _before(history, i)]
    if scores:
        out.append("score changes: " + ", ".join(scores[-4:]))
    since = steps_since_progress(history)
    if since >= 3:
        out.append(f"no progress for {since} steps")
    recent = Counter(s.action for s in history[-window:])
    repeated = [f"'{a}' x{n}" for a, n in recent.most_common(2) if n >= 3]
    if repeated:
        out.append(f"repeated in the last {min(window, len(history))} steps: " + ", ".join(repeated))
    errors = [str(s.index) for s in history if is_error_reply(s.observation)]
    if errors:
        out.append("error replies at steps " + ", ".join(errors[-5:]))
    last = history[-1]
    if last.lost:
        out.append(f"lost after step {last.index}")
    return out


def _before(history: tuple[Step, ...], i: int) -> float:
    return history[i - 1].score if i else 0.0
