"""Memory guidance: which records match a state, how each action mode applies them, what the trace
records, and that a restore no longer replays the abandoned branch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from eval.mistakes import after_restores, after_stays
from rir_runtime.agent import AgentContext
from rir_runtime.budgets import Budgets
from rir_runtime.controllers import HeuristicController
from rir_runtime.decisions import Failure, Reflection
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.envs.checkpoints import Step
from rir_runtime.guidance import EXCLUDED, Guidance
from rir_runtime.llm import make_backend
from rir_runtime.loop import EpisodeRunner
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import LLMPolicy
from rir_runtime.recovery import PRESETS
from rir_runtime.trace import GuidanceEvent, replay
from tests.factories import FakeCompletion

SEEN = "You are at the bench. A knife lies here."
FAILURE = Failure(f"after seeing: {SEEN}", "take knife", "the knife cut you", "do not 'take knife' here")
HISTORY = (Step(0, "go to bench", SEEN, 0.0),)
ACTIONS = ["take knife", "take fork", "look"]


def memory(*, anchored: bool = True, mode: str = "structured") -> ReflectionMemory:
    m = ReflectionMemory(objective="cook", mode=mode)  # type: ignore[arg-type]
    m.add(Reflection(failure=FAILURE), anchor=("go to bench",) if anchored else None)
    return m


def context(mem: ReflectionMemory, guidance: Guidance, observation: str = SEEN, history=HISTORY) -> AgentContext:
    return AgentContext("builtin/t", "cook", mem, history, observation, lambda: list(ACTIONS), guidance)


# --- which records match -----------------------------------------------------------------------------------
def test_a_record_matches_at_its_checkpoint_and_where_its_condition_is_seen_again() -> None:
    soft = Guidance("soft")
    assert soft.warnings(memory(), HISTORY, "somewhere else") == {"take knife": "failure record at this checkpoint"}
    by_condition = soft.warnings(memory(anchored=False), (), SEEN)
    assert list(by_condition) == ["take knife"] and "condition" in by_condition["take knife"]
    assert soft.warnings(memory(anchored=False), HISTORY, "A dark cellar. Nothing here.") == {}
    assert Guidance("off").warnings(memory(), HISTORY, SEEN) == {}
    assert soft.warnings(memory(mode="text"), HISTORY, SEEN) == {}  # text memories are read, not enforced


def test_an_abandoned_branch_is_remembered_only_at_its_own_prefix() -> None:
    mem = ReflectionMemory(objective="cook")
    mem.remember_abandoned(("go to bench",), "take fork")
    soft = Guidance("soft")
    assert soft.warnings(mem, HISTORY, "x") == {"take fork": "abandoned branch at this checkpoint"}
    assert soft.warnings(mem, (), "x") == {} and soft.warnings(mem, HISTORY + HISTORY, "x") == {}
    assert mem.render() == ""  # a runtime record for guidance: the agent's prompt does not show it
    assert ReflectionMemory.from_snapshot(mem.snapshot()).anchored == mem.anchored


def test_penalties_never_exclude_every_candidate() -> None:
    warned = {"take knife": "x"}
    assert Guidance("soft", 2.5).penalties(["Action: take knife", "Action: look"], warned) == {0: 2.5}
    assert Guidance("hard").penalties(["Action: take knife", "Action: look"], warned) == {0: EXCLUDED}
    assert Guidance("hard").penalties(["Action: take knife"], warned) == {}
    with pytest.raises(ValueError, match="memory_guidance"):
        Guidance("sometimes")  # type: ignore[arg-type]


# --- how each action mode applies them --------------------------------------------------------------------
@dataclass
class Scores:
    """Log-likelihoods by action: a narrow stand-in for a model."""

    by_action: dict[str, float]
    name: str = "scores"
    supports_scoring: bool = True

    def score(self, prompt, continuations):
        return [self.by_action[c.removeprefix("Action: ")] for c in continuations]


@pytest.mark.parametrize(
    ("mode", "penalty", "chosen"),
    [("off", 5.0, "take knife"), ("soft", 5.0, "take fork"), ("soft", 0.5, "take knife"), ("hard", 0.0, "take fork")],
)
def test_ranking_takes_the_penalty_off_the_warned_action(mode: str, penalty: float, chosen: str) -> None:
    backend = Scores({"take knife": -1.0, "take fork": -2.0, "look": -9.0})
    act = LLMPolicy(backend, "rank").act(context(memory(), Guidance(mode, penalty)))  # type: ignore[arg-type]
    assert act.text == chosen
    if mode == "off":
        assert act.guided is None
    else:
        assert act.guided is not None and act.guided.warned == ("take knife",) and act.guided.scores == (-1.0,)
        assert act.guided.unguided == "take knife" and act.guided.changed == (chosen != "take knife")


@pytest.fixture(scope="module")
def tiny():
    return make_backend("tiny-random-llama")


def test_constrained_decoding_pays_the_penalty(tiny) -> None:
    free = LLMPolicy(tiny, "constrain").act(context(ReflectionMemory(objective="cook"), Guidance("off"))).text
    mem = ReflectionMemory(objective="cook")
    mem.remember_abandoned(("go to bench",), free)
    guided = LLMPolicy(tiny, "constrain").act(context(mem, Guidance("soft", 1000.0)))
    assert guided.text != free and guided.guided is not None
    assert guided.guided.unguided == free and guided.guided.warned == (free,)
    small = LLMPolicy(tiny, "constrain").act(context(mem, Guidance("soft", 0.0)))
    assert small.text == free  # no penalty, no change


@dataclass
class Replies:
    replies: list[str]
    name: str = "replies"
    supports_scoring: bool = False

    def generate(self, prompts, **kwargs):
        return [FakeCompletion(self.replies.pop(0))]


@pytest.mark.parametrize(
    ("mode", "replies", "chosen"),
    [
        ("soft", ["Action: take knife", "Action: take fork"], "take fork"),
        ("soft", ["Action: take knife", "Action: take knife"], "take knife"),  # redrawn once, then accepted
        ("hard", ["Action: take knife"] * 3, "take fork"),  # the first admissible action not warned against
    ],
)
def test_generate_mode_rejects_and_redraws(mode: str, replies: list[str], chosen: str) -> None:
    act = LLMPolicy(Replies(list(replies)), "generate").act(context(memory(), Guidance(mode)))  # type: ignore[arg-type]
    assert act.text == chosen and act.guided is not None and act.guided.unguided == "take knife"


# --- in the loop -----------------------------------------------------------------------------------------
def run(method: str, task: TaskSpec, backend):
    env = WorkshopEnv()
    policy = LLMPolicy(backend, "rank", name="llm:tiny")
    return EpisodeRunner(env, policy, HeuristicController(), PRESETS[method], Budgets(30, 3)).run(task)


def test_guidance_changes_the_action_after_a_recovery_and_is_recorded(tiny) -> None:
    """The tiny model repeats one action; each recovery blames it. Unguided, the agent takes the
    blamed action again after every recovery; under hard guidance, never."""
    tasks = [TaskSpec("builtin", "workshop-3", "dev", v) for v in range(3)]
    counts: dict[str, Counter] = {}
    for method in ("rir-unguided", "rir-hard"):
        counts[method] = Counter()
        for task in tasks:
            record = run(method, task, tiny)
            counts[method] += after_restores(replay(record).branches) + after_stays(record.events)
            guided = [e for e in record.events if isinstance(e, GuidanceEvent)]
            assert bool(guided) == (method == "rir-hard")
            assert all(e.penalty is None and e.changed for e in guided)
    unguided, hard = counts["rir-unguided"], counts["rir-hard"]
    assert sum(unguided.values()) >= 3 and not (unguided["another action"] + unguided["another action (k = 0)"])
    assert sum(hard.values()) >= 3
    assert not (hard["the abandoned action again"] + hard["the blamed action again (k = 0)"])
