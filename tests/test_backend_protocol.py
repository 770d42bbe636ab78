"""Every backend and wrapper implements the whole `Backend` protocol, so `--concurrency > 1` (which wraps
the model in `BatchingBackend`) changes how calls are scheduled, never what the controllers and
policies decide. On tiny-random-llama: seconds."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Literal

import pytest

from rir_runtime.agent import AgentContext
from rir_runtime.controllers import PromptedController
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UserInputError
from rir_runtime.llm import Backend, OpenAIBackend, TransformersBackend, make_backend
from rir_runtime.llm.batching import BatchingBackend
from rir_runtime.lockstep import Lockstep
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import LLMPolicy
from rir_runtime.prompts import DecisionContext

STEPS = (
    Step(0, "take key", "You take the key.", 0.0),
    Step(1, "eat key", "You can't eat that.", 0.0),
    Step(2, "go north", "You are in the hall.", 0.0),
    Step(3, "examine door", "The door is locked.", 0.0),
    Step(4, "eat key", "You can't eat that.", 0.0),
)
CTX = DecisionContext(
    task="workshop",
    objective="Open the door.",
    memory="",
    history=STEPS,
    observation="You can't eat that.",
    score=0.0,
    admissible=tuple(range(6)),
    segments=((0, 2), (2, 4), (4, 6)),
    segment=(0, 6),
    restore_point=1,
)
ACTIONS = ["go north", "go south", "take key", "open door", "examine door"]


@pytest.fixture(scope="module")
def tiny() -> TransformersBackend:
    backend = make_backend("tiny-random-llama", max_batch_size=8)
    assert isinstance(backend, TransformersBackend)
    return backend


def _decide(controller: PromptedController, ctx: DecisionContext) -> list:
    return [controller.review(ctx), controller.locate_coarse(ctx), controller.locate_fine(ctx)]


def test_prompted_controller_through_batching_ranks_as_over_the_plain_backend(tiny: TransformersBackend) -> None:
    plain = PromptedController(tiny, "prompted:tiny")
    batched = PromptedController(BatchingBackend(tiny), "prompted:tiny")
    for want, got in zip(_decide(plain, CTX), _decide(batched, CTX), strict=True):
        assert want.meta.get("ranked") is True, f"{want.kind} over the plain backend was not ranked"
        assert got.meta.get("ranked") is True, f"{got.kind} through BatchingBackend was not ranked: {got.meta}"
        assert (got.kind, got.value, got.raw) == (want.kind, want.value, want.raw)
    want, got = plain.reflect(CTX), batched.reflect(CTX)  # one episode: its generate calls are batches of one
    assert got.meta.get("structured") is True, f"the reflection through BatchingBackend was not structured: {got.meta}"
    assert (got.value, got.raw) == (want.value, want.raw)


def test_concurrent_episodes_through_batching_decide_as_one_at_a_time(tiny: TransformersBackend) -> None:
    """Four threads of one lockstep group share the wrapper (as `--concurrency 4` does): their scoring
    calls go out in batches, and each context gets the decisions it gets alone."""
    contexts = [replace(CTX, observation=f"You can't eat that ({i}).", history=STEPS[: 2 + i]) for i in range(4)]
    plain = PromptedController(tiny, "prompted:tiny")
    want = [[(d.kind, d.value) for d in _decide(plain, c)] for c in contexts]
    wrapper = BatchingBackend(tiny)
    batched = PromptedController(wrapper, "prompted:tiny")
    got: dict[int, list] = {}
    group = Lockstep()
    group.reserve(4)  # counted before any thread starts, so a slow start cannot leave the first alone

    def episode(i: int) -> None:
        with group.member(reserved=True):
            got[i] = [(d.kind, d.value, d.meta.get("ranked")) for d in _decide(batched, contexts[i])]

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [[(k, v) for k, v, _ in got[i]] for i in range(4)] == want
    assert all(ranked is True for i in range(4) for _, _, ranked in got[i])
    assert max(wrapper.batches) > 1, f"the group's calls were sent one at a time: {wrapper.batches}"


@pytest.mark.parametrize("mode", ["constrain", "rank"])
def test_llm_policy_acts_through_batching(tiny: TransformersBackend, mode: Literal["constrain", "rank"]) -> None:
    ctx = AgentContext("t", "Open the door.", ReflectionMemory(), STEPS[:2], "You can't eat that.", lambda: ACTIONS)
    want = LLMPolicy(tiny, mode).act(ctx)
    got = LLMPolicy(BatchingBackend(tiny), mode).act(ctx)
    assert got == want
    assert got.kind == "rollback" or got.text in ACTIONS


def test_every_backend_and_wrapper_is_a_backend(tiny: TransformersBackend) -> None:
    from rir_runtime.llm.tuned import TunedBackend

    remote = OpenAIBackend("http://127.0.0.1:9", "m", guided="off")  # no server: choose must refuse, not ask
    tuned = TunedBackend(tiny.model, tiny.tokenizer, "tuned:x", {"kind": "controller"})
    for backend in (tiny, remote, tuned, BatchingBackend(tiny), BatchingBackend(remote)):
        assert isinstance(backend, Backend), type(backend).__name__
    assert tuned.supports_scoring and tuned.card == {"kind": "controller"} and tuned.tokenizer.padding_side == "left"
    assert BatchingBackend(tiny).supports_scoring and BatchingBackend(tiny).name == tiny.name
    wrapped = BatchingBackend(remote)
    assert not wrapped.supports_scoring  # so a prompted controller over it generates instead of ranking
    assert PromptedController(wrapped, "prompted:m").rank is False
    with pytest.raises(UserInputError, match="cannot constrain decoding"):
        wrapped.choose("prompt", ["a", "b"])

    class GenerateOnly:  # what BatchingBackend used to be: no supports_scoring, no choose
        name = "x"

        def generate(self, prompts, **kwargs):
            return []

        def score(self, prompt, continuations):
            return []

    assert not isinstance(GenerateOnly(), Backend)


def test_workers_and_concurrency_together_are_rejected() -> None:
    from rir_runtime.orchestration.config import build_config
    from rir_runtime.orchestration.jobs import SelectionConfig

    assert SelectionConfig(workers=2).workers == 2 and SelectionConfig(concurrency=4).concurrency == 4
    with pytest.raises(ValueError, match="workers=2 and concurrency=4 cannot be combined.*drop --workers"):
        SelectionConfig(workers=2, concurrency=4)
    with pytest.raises(UserInputError, match="cannot be combined.*drop --concurrency"):
        build_config(SelectionConfig, {"workers": 3, "concurrency": 2})
