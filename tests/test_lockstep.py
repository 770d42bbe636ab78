"""Branches played together: a lockstep group batches its threads' model calls, a decision's
continuations run on engines of their own, and what they find is what one branch at a time finds."""

from __future__ import annotations

import threading
import time

import pytest

from rir_runtime.branching import BranchingRunner, Forced
from rir_runtime.budgets import Budgets
from rir_runtime.controllers import HeuristicController
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.envs.checkpoints import Step
from rir_runtime.guidance import Guidance
from rir_runtime.llm.batching import BatchingBackend
from rir_runtime.llm.factory import make_backend
from rir_runtime.lockstep import Lockstep, current_group, run_together
from rir_runtime.loop import EpisodeRunner
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import LLMPolicy, NoisyExpertPolicy
from rir_runtime.recovery import PRESETS
from rir_runtime.values import AgentProbe, Continuation, Played, Start, looping, play_together
from tests.factories import ChatHandler, chat_server

TASKS = [TaskSpec("builtin", task, "dev", v) for task in ("workshop-3", "workshop-4") for v in range(8)]


class Recording:
    """A stand-in model that answers `score_many` with each continuation's length and records batches."""

    name, supports_scoring = "recording", True

    def __init__(self) -> None:
        self.batches: list[int] = []

    def score_many(self, requests):  # type: ignore[no-untyped-def]
        self.batches.append(len(requests))
        time.sleep(0.01)  # a forward pass takes time: the other members queue meanwhile
        return [[float(len(c)) for c in continuations] for _, continuations in requests]


def test_a_groups_calls_go_out_together_and_a_finished_member_is_not_waited_for() -> None:
    model = Recording()
    backend = BatchingBackend(model)  # type: ignore[arg-type]
    calls = [3, 3, 3, 1]  # the fourth member leaves after one call

    def member(i: int, slot: int) -> list[list[float]]:
        return [backend.score(f"prompt {i} {n}", ["a" * (i + 1)]) for n in range(calls[i])]

    got = run_together([lambda slot, i=i: member(i, slot) for i in range(4)], width=4)
    assert got == [[[float(i + 1)]] * calls[i] for i in range(4)]  # each member got its own answers
    assert model.batches == [4, 3, 3], f"calls were not sent in lockstep: {model.batches}"
    assert backend.batches == model.batches


def test_an_error_reaches_the_caller_whose_call_failed_and_the_group_goes_on() -> None:
    class Failing(Recording):
        def score_many(self, requests):  # type: ignore[no-untyped-def]
            if any(prompt == "bad" for prompt, _ in requests):
                raise ValueError("the model refused")
            return super().score_many(requests)

    backend = BatchingBackend(Failing())  # type: ignore[arg-type]
    jobs = [lambda slot: backend.score("bad", ["x"]), lambda slot: backend.score("good", ["xy"])]
    with pytest.raises(ValueError, match="the model refused"):
        run_together(jobs, width=2)  # both shared the failing batch: the first job's error is raised
    assert run_together([lambda slot: backend.score("good", ["xyz"])] * 3, width=3) == [[3.0]] * 3


def test_a_member_that_starts_a_group_of_its_own_is_not_waited_for_by_the_outer_one() -> None:
    model = Recording()
    backend = BatchingBackend(model)  # type: ignore[arg-type]
    outer = Lockstep()
    inner_groups = []

    def outer_member(i: int) -> None:
        with outer.member():
            backend.score(f"outer {i}", ["a"])
            if i == 0:  # an oracle valuing a decision inside an episode of a threaded worker
                inner_groups.append(run_together([lambda slot: backend.score("inner", ["b"])] * 3, width=3))
                assert current_group() is outer
            backend.score(f"outer {i} again", ["a"])

    threads = [threading.Thread(target=outer_member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "the outer group waited for a member busy with its own group"
    assert inner_groups == [[[1.0]] * 3]


def test_siblings_are_spawned_once_and_each_holds_its_own_state(workshop: WorkshopEnv, task3: TaskSpec) -> None:
    envs = workshop.siblings(3)
    assert envs[0] is workshop and len(envs) == 3 and workshop.siblings(3) == envs
    for env in envs:
        env.reset(task3)
    envs[1].step(envs[1].expert_actions()[0])
    assert envs[1].checkpoint().actions != workshop.checkpoint().actions


def test_a_loop_is_one_step_or_a_pair_repeated_with_the_same_replies() -> None:
    def steps(*pairs: tuple[str, str]) -> tuple[Step, ...]:
        return tuple(Step(i, a, o, 0.0) for i, (a, o) in enumerate(pairs))

    same = ("examine cookbook", "A recipe.")
    assert looping(steps(same, same, same))
    assert not looping(steps(same, same)) and not looping(steps(same, same, same), repeats=0)
    assert not looping(steps(same, same, ("examine cookbook", "Another page.")))  # the reply changed
    pair = [("open fridge", "Opened."), ("close fridge", "Closed.")]
    assert looping(steps(*pair * 3)) and not looping(steps(*pair * 2))


def _starts(env: WorkshopEnv, task: TaskSpec) -> list[Start]:
    """Starts along the expert's branch: checkpoints 0, 2 and 4, with an empty memory."""
    obs = env.reset(task)
    memory = ReflectionMemory(objective=obs.objective)
    history: tuple[Step, ...] = ()
    starts, observation = [], obs.text
    for t in range(5):
        if t % 2 == 0:
            starts.append(Start(env.checkpoint(), history, memory, observation))
        action = env.expert_actions()[0]
        result = env.step(action)
        history += (Step(len(history), action, result.observation, result.score, result.won, result.lost),)
        observation = result.observation
    return starts


@pytest.mark.parametrize("width", [2, 4])
def test_continuations_played_together_find_what_one_at_a_time_finds(width: int) -> None:
    env = WorkshopEnv()
    for task in TASKS:
        starts = _starts(env, task)
        runs = [Continuation(s, k, 30) for s in starts for k in range(3)]
        fork = NoisyExpertPolicy(env, 0.3).fork
        alone = play_together(env, fork, task.key, "", runs, Guidance(), width=1)
        together = play_together(env, fork, task.key, "", runs, Guidance(), width=width)
        assert together == alone, task.key


def test_an_llm_agents_values_played_together_equal_one_at_a_time() -> None:
    """The tiny random model ranks the workshop's actions: its continuations' calls are batched (tree
    scoring over pooled prompts) and decide what the one-at-a-time path decides."""
    backend = BatchingBackend(make_backend("tiny-random-llama"))
    env = WorkshopEnv()
    task = TASKS[0]
    policy = LLMPolicy(backend, "rank")
    starts = _starts(env, task)[:2]
    runs = [Continuation(s, 0, 3) for s in starts]
    alone = play_together(env, policy.fork, task.key, "", runs, Guidance(), width=1, loop_repeats=0)
    before = len(backend.batches)
    together = play_together(env, policy.fork, task.key, "", runs, Guidance(), width=2, loop_repeats=0)
    assert together == alone
    assert max(backend.batches[before:]) == len(runs), "the continuations' agent calls were not batched"


def test_an_oracle_agents_episode_is_the_same_whatever_the_width() -> None:
    def run(task: TaskSpec, width: int) -> tuple:
        env = WorkshopEnv()
        runner = EpisodeRunner(
            env, NoisyExpertPolicy(env, 0.2), _oracle(), PRESETS["rir"], Budgets(40, 1), 8, branch_width=width
        )
        record = runner.run(task)
        return record.success, [(type(e).__name__, getattr(e, "to", None)) for e in record.events]

    for task in TASKS[:6]:
        assert run(task, 1) == run(task, 4), task.key


def _oracle():  # type: ignore[no-untyped-def]
    from rir_runtime.controllers import AgentOracleController

    return AgentOracleController()


def test_branches_from_one_fork_played_together_end_as_one_at_a_time() -> None:
    decisions = [Forced(False), Forced(True), Forced(True, restore_to=0), Forced(True, restore_to=2, draw=1)]

    def outcomes(task: TaskSpec, width: int) -> list[tuple]:
        env = WorkshopEnv()
        runner = BranchingRunner(
            env, NoisyExpertPolicy(env, 0.3), HeuristicController(), PRESETS["rir"], Budgets(40, 2), 4,
            branch_width=width,
        )  # fmt: skip
        got = runner.branches(task, 0, decisions)
        return [(o.success, o.rollbacks, o.env_steps, o.fingerprint) for o in got]

    for task in TASKS[:6]:
        alone = outcomes(task, 1)
        assert len({fp for *_, fp in alone}) == 1  # every branch started from one state
        assert outcomes(task, 4) == alone, task.key


def test_an_agent_probe_values_every_option_once_however_wide() -> None:
    env = WorkshopEnv()
    task = TASKS[1]
    starts = dict(enumerate(_starts(env, task)))
    values = {}
    for width in (1, 3):
        probe = AgentProbe(env, NoisyExpertPolicy(env, 0.3).fork, Guidance(), rollouts=2, width=width)
        values[width] = probe.values(task.key, "", starts, 30)
        assert probe.continuations == 2 * len(starts)
        assert probe.values(task.key, "", starts, 30) == values[width] and probe.continuations == 2 * len(starts)
    assert values[1] == values[3]


class _Slow(ChatHandler):
    """Takes 0.1 s a request and counts the requests in flight at once."""

    content = "Action: look around"
    lock, in_flight, most, requests = threading.Lock(), 0, 0, 0

    def received(self, body: dict) -> None:
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most, cls.requests = max(cls.most, cls.in_flight), cls.requests + 1
        time.sleep(0.1)
        with cls.lock:
            cls.in_flight -= 1


def test_a_server_sees_the_live_branches_calls_as_concurrent_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a vLLM server batches: at each step, one request per live branch, sent together."""
    with chat_server(_Slow, monkeypatch) as url:
        backend = BatchingBackend(make_backend(f"openai:m@{url}"))
        env, task = WorkshopEnv(), TASKS[0]
        runs = [Continuation(s, 0, 3) for s in _starts(env, task)[:2]] * 2  # four branches
        policy = LLMPolicy(backend, "generate")
        play_together(env, policy.fork, task.key, "", runs, Guidance(), width=4, loop_repeats=0)
    assert _Slow.requests == 4 * 3
    assert _Slow.most == 4, f"the branches' calls reached the server {_Slow.most} at a time, not 4"
    assert backend.batches == [4, 4, 4]


def test_a_played_continuation_answers_for_smaller_caps_and_a_win_for_larger_ones() -> None:
    won_at_3, lost_at_2, capped_at_4 = Played(True, 3, 3, False), Played(False, 2, 2, False), Played(False, 4, 4, True)
    assert [won_at_3.within(c) for c in (2, 3, 10)] == [False, True, True]
    assert [lost_at_2.within(c) for c in (1, 5)] == [False, False]
    assert [capped_at_4.within(c) for c in (3, 4, 5)] == [False, False, None]  # 5 calls: not known, play again


def test_a_later_review_with_fewer_calls_left_reads_the_continuations_already_played() -> None:
    env = WorkshopEnv()
    task = TASKS[2]
    starts = dict(enumerate(_starts(env, task)))
    probe = AgentProbe(env, NoisyExpertPolicy(env, 0.3).fork, Guidance())
    probe.values(task.key, "", starts, 30)
    played = probe.continuations
    for cap in (20, 8, 3):  # each is what a probe that never played finds, and nothing is played again
        fresh = AgentProbe(env, NoisyExpertPolicy(env, 0.3).fork, Guidance())
        assert probe.values(task.key, "", starts, cap) == fresh.values(task.key, "", starts, cap)
    assert probe.continuations == played
