"""Rollback-Consistent Reflection Memory: what survives a rollback.

The world and the branch history roll back; this memory does not. It keeps only knowledge that
stays true after restoration: the task objective, reusable environment knowledge, milestones
reached in past attempts, and *conditioned* failure analyses. Claims about the current state
("the door is open", "I am holding the knife") are excluded, because the restore makes them
stale. A lesson is stored with its condition, never as a global ban on an action.

Two modes serve the presets: `structured` (RIR) and `text` (self-refine and Reflexion keep
their free-text reflection, unfiltered, as those methods do).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rir_runtime.decisions import Failure, Reflection

if TYPE_CHECKING:
    from rir_runtime.envs.checkpoints import Step

MemoryMode = Literal["none", "text", "structured"]

# Phrases that describe the present state of the world or the agent. Conservative on purpose:
# a dropped true fact costs little, a kept stale one misleads every later step.
_STATE_CLAIM = re.compile(
    r"\b(currently|right now|at the moment|now (is|are|has|have)|i am (in|at|holding|carrying)|i have|"
    r"you are (in|at|holding|carrying)|you have|i('m| am) holding|is (now )?(open|closed|on|off|empty|full|"
    r"broken|lit|hot|cold|cooked|sliced|chopped|burned|burnt)|are (now )?(open|closed|on|off)|"
    r"in (my|your) (hand|inventory)|already (taken|opened|done|picked))\b",
    re.IGNORECASE,
)


def is_state_claim(text: str) -> bool:
    """True when `text` asserts something about the current state (stale after a restore)."""
    return bool(_STATE_CLAIM.search(text))


@dataclass
class ReflectionMemory:
    """The persistent memory `M`; `render()` is what the agent sees in its prompt."""

    objective: str = ""
    mode: MemoryMode = "structured"
    env_knowledge: list[str] = field(default_factory=list)
    milestones: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # free-text reflections (text mode)
    # Where actions failed, exactly: the branch prefix (actions up to a restore point) and the
    # action taken there. Not shown to the agent; memory guidance acts on them (guidance.py).
    anchored: list[Anchored] = field(default_factory=list)
    dropped_state_claims: int = 0
    keep_state_claims: bool = False  # ablation only: the memory that keeps current-state claims
    keep_failures: bool = True  # ablation only: memory without failure analyses

    def add(self, reflection: Reflection, anchor: tuple[str, ...] | None = None) -> None:
        """Merge one reflection distilled from an abandoned suffix; `anchor` is the branch prefix
        (actions) at the restore point, where its failure record was made."""
        if self.mode == "none":
            return
        if self.mode == "text":
            text = reflection.as_text()
            if text and text not in self.notes:
                self.notes.append(text)
            return
        for fact in reflection.env_knowledge:
            self._add_unique(self.env_knowledge, fact)
        for milestone in reflection.milestones:
            self._add_unique(self.milestones, milestone)
        failure = reflection.failure
        if failure and self.keep_failures and failure not in self.failures:
            if not self.keep_state_claims and is_state_claim(failure.lesson):
                failure = Failure(failure.condition, failure.action, failure.outcome, f"avoid '{failure.action}' then")
                self.dropped_state_claims += 1
            self.failures.append(failure)
        if failure and self.keep_failures and anchor is not None:
            self._anchor(Anchored(anchor, failure.action, "failure record"))

    def keep(self, reflection: Reflection, history: Sequence[Step], r: int, remember_abandoned: bool) -> None:
        """What a recovery to checkpoint r of `history` keeps: the reflection, anchored at the branch
        prefix, and with `remember_abandoned` the step it abandoned (the loop and V_agent share this)."""
        prefix = tuple(s.action for s in history[:r])
        self.add(reflection, anchor=prefix)
        if remember_abandoned and r < len(history):
            self.remember_abandoned(prefix, history[r].action)

    def remember_abandoned(self, prefix: tuple[str, ...], action: str) -> None:
        """A restore abandoned the branch that took `action` after `prefix`: a record, conditioned on
        that exact prefix, so that a greedy agent does not walk the same path again."""
        if self.mode == "structured":
            self._anchor(Anchored(prefix, action, "abandoned branch"))

    def _anchor(self, record: Anchored) -> None:
        if record not in self.anchored:
            self.anchored.append(record)

    def _add_unique(self, target: list[str], text: str) -> None:
        if not self.keep_state_claims and is_state_claim(text):
            self.dropped_state_claims += 1
            return
        if text not in target:
            target.append(text)

    def forbids(self, action: str, condition_hint: str = "") -> bool:
        """Whether a remembered failure matches `action` here: the same action, and either no
        condition recorded or a condition that appears in `condition_hint` (the situation now)."""
        action = action.strip().lower()
        for f in self.failures:
            if f.action.strip().lower() == action and (
                not condition_hint or condition_matches(f.condition, condition_hint)
            ):
                return True
        return any(f"'{action}'" in note.lower() for note in self.notes)

    def render(self, max_chars: int = 1200) -> str:
        """The memory block of the agent prompt, newest lessons kept when over `max_chars`."""
        if self.mode == "none":
            return ""
        lines: list[str] = []
        if self.mode == "text":
            lines += [f"- {n}" for n in self.notes]
        else:
            lines += [f"- Known: {k}" for k in self.env_knowledge]
            lines += [f"- Reached before: {m}" for m in self.milestones]
            lines += [f"- When {f.condition}: '{f.action}' -> {f.outcome}. Lesson: {f.lesson}" for f in self.failures]
        if not lines:
            return ""
        kept: list[str] = []
        size = 0
        for line in reversed(lines):  # newest last in the list; keep from the end
            if size + len(line) + 1 > max_chars:
                break
            kept.append(line)
            size += len(line) + 1
        return "\n".join(reversed(kept))

    @classmethod
    def from_snapshot(
        cls, snapshot: MemorySnapshot | None, objective: str = "", mode: MemoryMode = "structured"
    ) -> ReflectionMemory:
        """Rebuild a memory from its trace form (data_gen renders prompts from recorded episodes)."""
        snapshot = snapshot or MemorySnapshot()
        memory = cls(objective=objective, mode=mode)
        memory.env_knowledge = list(snapshot.env_knowledge)
        memory.milestones = list(snapshot.milestones)
        memory.failures = list(snapshot.failures)
        memory.notes = list(snapshot.notes)
        memory.anchored = list(snapshot.anchored)
        return memory

    def snapshot(self) -> MemorySnapshot:
        """The memory as it stands, for the episode trace."""
        return MemorySnapshot(
            tuple(self.env_knowledge),
            tuple(self.milestones),
            tuple(self.failures),
            tuple(self.notes),
            tuple(self.anchored),
        )


@dataclass(frozen=True)
class Anchored:
    """`action`, taken right after the branch prefix `prefix`, failed (`source` says how we know)."""

    prefix: tuple[str, ...]
    action: str
    source: str  # "failure record" (a reflection's) or "abandoned branch" (left by a restore)


@dataclass(frozen=True)
class MemorySnapshot:
    """The trace form of the memory: what survived the rollbacks so far (lists are tuples: immutable)."""

    env_knowledge: tuple[str, ...] = ()
    milestones: tuple[str, ...] = ()
    failures: tuple[Failure, ...] = ()
    notes: tuple[str, ...] = ()
    anchored: tuple[Anchored, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "env_knowledge": list(self.env_knowledge),
            "milestones": list(self.milestones),
            "failures": [asdict(f) for f in self.failures],
            "notes": list(self.notes),
            "anchored": [{"prefix": list(a.prefix), "action": a.action, "source": a.source} for a in self.anchored],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemorySnapshot:
        return cls(
            tuple(data.get("env_knowledge", ())),
            tuple(data.get("milestones", ())),
            tuple(Failure(**f) for f in data.get("failures", ())),
            tuple(data.get("notes", ())),
            tuple(Anchored(tuple(a["prefix"]), a["action"], a["source"]) for a in data.get("anchored", ())),
        )


def condition_matches(condition: str, situation: str) -> bool:
    """A condition matches when most of its content words occur in the situation description."""
    words = {w for w in re.findall(r"[a-z]+", condition.lower()) if len(w) > 3}
    if not words:
        return True
    seen = set(re.findall(r"[a-z]+", situation.lower()))
    return len(words & seen) / len(words) >= 0.5
