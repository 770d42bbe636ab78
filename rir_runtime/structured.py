"""Reflections filled into a fixed JSON skeleton, so a small model's What always parses.

Free generation of the reflection JSON fails on small models: they copy the prompt's
`[<reusable facts>]` placeholder or break the object's structure. Here the runtime writes the keys
and brackets, in the order of the training targets (`decisions.dump`), and the model decides only
what the targets leave open:

- the two lists are generated up to their closing `]` and kept if they read as JSON strings;
- the failure's action is ranked among the actions of the abandoned branch (the steps from the
  restore point on), after a condition the model writes as the targets order it, so the record
  always blames a step that really happened;
- the rest of the failure record is written from the trajectory around the blamed step
  (`failure_record`), as the training targets write it: the condition is what was seen before it,
  the outcome how the branch ended, the lesson `avoid_lesson`. Memory guidance matches a record by
  its condition when the agent stands there again, so a paraphrased condition ("after 2: 50", as a
  270M adapter wrote) turns the guidance off; and the training data's lesson is a fixed function
  of the blamed action, which a small model reproduced in fewer than half of its reflections.

It needs a backend that can continue a begun assistant message and score continuations (the
local transformers backends, tuned adapters included). The reply counts as one model call against
B_agent, like any other constrained decode (a server with guided decoding would make it one
request); its four decoding passes are in `meta["passes"]` and all their tokens are counted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from rir_runtime.decisions import Decision, Failure, Reflection, avoid_lesson
from rir_runtime.envs.checkpoints import Step
from rir_runtime.llm.base import Backend
from rir_runtime.prompts import DecisionContext, Messages, content_tokens

SLOT_TOKENS = 64  # one value; the heuristic What's condition and outcome are clipped near this length


def abandoned_actions(ctx: DecisionContext) -> list[str]:
    """The actions a failure record may blame: those of the abandoned branch, else (nothing is
    abandoned) all of them, in order, without repeats."""
    steps = ctx.history[ctx.restore_point or 0 :] or ctx.history
    return list(dict.fromkeys(s.action for s in steps))


def failure_record(history: tuple[Step, ...], blamed: int) -> Failure:
    """The failure record that blames step `blamed`, written from the trajectory alone: the
    heuristic's What, the hindsight labels and the structured model What share it."""
    before = history[blamed - 1].observation if blamed > 0 else "at the start"
    last = history[-1]
    outcome = last.observation if last.lost else f"the attempt failed later ({last.observation[:120]})"
    action = history[blamed].action
    return Failure(f"after seeing: {before[:120]}", action, outcome[:200], avoid_lesson(action))


def blamed_step(ctx: DecisionContext, action: str) -> int:
    """The step a ranked action names: its first occurrence in the abandoned branch. A stay abandons
    nothing, so there it is the action's latest occurrence, the repeat nearest the failure: the
    condition is then what the agent sees when it is about to repeat it, as the heuristic's record of
    a loop reads, and memory guidance can recognise that moment."""
    start = ctx.restore_point or 0
    steps = [s.index for s in ctx.history if s.action == action]
    return next((i for i in steps if i >= start), steps[-1])


def grounded(reflection: Reflection, ctx: DecisionContext) -> Reflection:
    """A parsed free-text reflection with its failure record rewritten from the trajectory, as the
    structured What writes it, when the action it blames was taken; a record that blames an action
    the branch never took is kept as the model wrote it (it may paraphrase a real one)."""
    failure = reflection.failure
    if failure is None or not any(s.action == failure.action for s in ctx.history):
        return reflection
    return replace(reflection, failure=failure_record(ctx.history, blamed_step(ctx, failure.action)))


def _as_strings(text: str) -> list[str]:
    """The items generated inside `[...]`; anything that is not a JSON list of strings reads as empty."""
    try:
        items = json.loads(f"[{text}]")
    except ValueError:
        return []
    return [str(i).strip() for i in items if isinstance(i, str) and i.strip()]


class _Form:
    """One reply being written: the runtime appends fixed text, the model appends values."""

    def __init__(self, backend: Backend, messages: Messages) -> None:
        self.backend, self.messages, self.text = backend, messages, ""
        self.calls = self.prompt_tokens = self.completion_tokens = 0

    def _begun(self) -> Messages:
        return [*self.messages, {"role": "assistant", "content": self.text}]

    def write(self, fixed: str) -> None:
        self.text += fixed

    def generate(self, stop: str) -> str:
        completion = self.backend.generate([self._begun()], max_new_tokens=SLOT_TOKENS, stop=[stop])[0]
        self.calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        return completion.text

    def rank(self, options: list[str], close: str) -> str:
        begun = self._begun()
        scores = self.backend.score(begun, [json.dumps(o)[1:-1] + close for o in options])
        self.calls += 1
        self.prompt_tokens += content_tokens(begun)
        return options[max(range(len(options)), key=lambda i: scores[i])]


def fill_reflection(backend: Backend, messages: Messages, ctx: DecisionContext) -> Decision:
    """A reflection whose structure the runtime guarantees; the values are the model's. Every pass
    re-reads the same prompt, which a local backend finds again in its kept KV caches (`kv_pool.py`)."""
    form = _Form(backend, messages)
    lists: dict[str, list[str]] = {}
    for i, key in enumerate(("env_knowledge", "milestones")):
        form.write(f'{", " if i else "{"}"{key}": [')
        lists[key] = _as_strings(form.generate("]"))
        form.write(json.dumps(lists[key])[1:])
    actions = abandoned_actions(ctx)
    failure = None
    if actions:
        lists_text = form.text
        # The model writes a condition and ranks the blamed action after it, as its training targets
        # read; the record kept is then the trajectory's (`failure_record`), written over both.
        form.write(', "failure": {"condition": "')
        form.write(json.dumps(form.generate('"').strip())[1:] + ', "action": "')
        failure = failure_record(ctx.history, blamed_step(ctx, form.rank(actions, '"')))
        form.text = lists_text + ', "failure": ' + json.dumps(asdict(failure), ensure_ascii=False)
    else:
        form.write(', "failure": null')
    form.write("}")
    reflection = Reflection(tuple(lists["env_knowledge"]), tuple(lists["milestones"]), failure)
    return Decision(
        "reflect",
        reflection,
        form.text,
        0,
        1,
        form.prompt_tokens,
        form.completion_tokens,
        {"structured": True, "passes": form.calls},
    )
