"""Base policies: the LLM agent, and a scripted error-injected expert for controlled experiments.

A policy sees an `AgentContext` and answers an `AgentAction` (`agent.py`): a task action, a call of the
`rollback` tool (with a reason), or a final response that ends the episode.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from rir_runtime.agent import AgentAction, AgentContext, Policy
from rir_runtime.envs.base import Env
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UnknownNameError
from rir_runtime.guidance import EXCLUDED, GuidedChoice
from rir_runtime.llm.base import Backend
from rir_runtime.policy_spec import NOISY_EXPERT, PolicySpec
from rir_runtime.prompts import Messages, content_tokens, render_agent


# --- the error-injected expert ---------------------------------------------------------------------
def unit_draw(*parts: str) -> float:
    """A deterministic number in [0, 1) from strings: the same state always gives the same draw."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def plausible_mistake(right: str, actions: list[str], task: str, state: str) -> str | None:
    """A wrong action that shares the verb or the object of the `right` one, drawn
    deterministically from (task, state); None when no admissible action is that close."""
    words = right.split()
    similar = [a for a in actions if a != right and (a.split()[0] == words[0] or a.split()[-1] == words[-1])]
    if not similar:
        return None
    return similar[int(unit_draw(task, state, "pick") * len(similar))]


class NoisyExpertPolicy:
    """Follows the environment's expert plan, but at error points seeded by (task, state) takes a
    plausible wrong action: one that shares the verb or the object of the right one (slice vs
    chill the onion, focus on the wrong thing). Like a greedy LLM it repeats the same mistake from
    the same state, unless its memory holds a failure record for that action.

    When the expert has no plan (a silent error already doomed the branch and only the oracle
    knows), it keeps following its last plan, as an agent that has not noticed would.
    """

    name = NOISY_EXPERT

    def __init__(self, env: Env, error_rate: float = 0.15, seed: int = 0) -> None:
        self.env, self.error_rate, self.seed = env, error_rate, seed
        # plan remaining after acting in each state (keyed by the branch's action prefix)
        self._after: dict[tuple[str, ...], list[str]] = {}
        self._pending: frozenset[tuple[str, ...]] = frozenset()  # states where a mistake replaced the plan step

    def fork(self, env: Env, k: int) -> NoisyExpertPolicy:
        """Continuation k draws its errors with seed + 1000k: k = 0 makes the very mistakes this agent
        would, and remembers the plans it has seen (a silent mistake leaves the expert without one)."""
        twin = NoisyExpertPolicy(env, self.error_rate, self.seed + 1000 * k)
        twin._after, twin._pending = dict(self._after), self._pending
        return twin

    def act(self, ctx: AgentContext) -> AgentAction:
        state = tuple(s.action for s in ctx.history)
        plan = self.env.expert_actions()
        if not plan:
            plan = self._after.get(state[:-1], [])
            # After a mistake the intended step is still pending: take it if it is still possible
            # (the mistake was a detour), skip it if not (the mistake took its place, silently).
            if state[:-1] in self._pending and plan and plan[0] not in ctx.actions:
                plan = plan[1:]
        if not plan:
            return AgentAction("respond", "I cannot find a way to finish the task.")
        right, self._after[state] = plan[0], plan[1:]
        key = "|".join(state)
        if unit_draw(str(self.seed), ctx.task, key, right) < self.error_rate:
            wrong = plausible_mistake(right, ctx.actions, ctx.task, key)
            if wrong and not ctx.memory.forbids(wrong):
                self._after[state], self._pending = plan, self._pending | {state}
                return AgentAction("task", wrong, injected_error=True)
        return AgentAction("task", right)


# --- the LLM policy --------------------------------------------------------------------------------
MAX_LISTED_ACTIONS = 40  # ScienceWorld offers ~900 valid actions: beyond this, none are listed or ranked
MAX_HINTS = 200  # generate mode: up to this many actions are handed to the backend as decoding hints


def agent_prompt(
    objective: str, memory: str, history: tuple[Step, ...], observation: str, actions: list[str]
) -> list[dict[str, str]]:
    """The LLM policy's prompt. Behaviour-cloning data is rendered by this same function."""
    listed = actions if len(actions) <= MAX_LISTED_ACTIONS else []
    messages = render_agent(objective, memory, history, observation, listed)
    if not listed:
        note = f"({len(actions)} valid actions; answer with one of them)"
        messages[-1]["content"] = messages[-1]["content"].replace("Valid actions: ", f"Valid actions: {note}")
    return messages


TYPO_SIMILARITY = 0.9  # difflib ratio above which an unlisted reply is read as a listed action
MAX_ACTION_WORDS = 12  # a longer "action" is prose, not a command: ask again
_ACTION_LINE = re.compile(r"action\s*:\s*(.+)", re.IGNORECASE)


def match_action(text: str, actions: list[str]) -> tuple[AgentAction | None, str]:
    """Map a reply to an admissible action or the rollback tool; (None, reason) if impossible.

    An explicit `Action: <text>` that the list lacks is sent as typed unless it is a near typo of a
    listed action: environments take any text (the contract), and listings are incomplete
    (ScienceWorld accepts its gold paths' "move egg dove egg in inventory to green box" but lists
    only "move dove to green box"). Mapping an unlisted reply to a merely similar action would turn
    "open door to kitchen" into "move orange to kitchen" where no door is listed.
    """
    m = _ACTION_LINE.search(text)
    reply = (m.group(1) if m else text).strip()
    candidate = reply.splitlines()[0].strip().strip(".'\"`").lower() if reply else ""
    if not candidate:
        return None, "empty reply"
    if candidate.startswith("rollback"):
        rest = candidate[len("rollback") :].strip()
        target = re.match(r"(?:to\s+)?(\d+)\b", rest)
        return AgentAction("rollback", "rollback", reason=rest, target=int(target.group(1)) if target else None), ""
    lowered = {a.lower(): a for a in actions}
    if candidate in lowered:
        return AgentAction("task", lowered[candidate]), ""
    verb = candidate.split()[0]  # "open door to greenhouse" is 0.94 similar to "close door to greenhouse"
    close = [
        a
        for a in difflib.get_close_matches(candidate, list(lowered), n=3, cutoff=TYPO_SIMILARITY)
        if a.split()[0] == verb
    ]
    if close:
        return AgentAction("task", lowered[close[0]]), ""
    if m and len(candidate.split()) <= MAX_ACTION_WORDS:
        return AgentAction("task", candidate), ""
    return None, f"'{candidate}' is not a valid action"


ActionMode = Literal["rank", "generate", "constrain"]
MODES: tuple[ActionMode, ...] = ("rank", "generate", "constrain")


def action_mode(name: str) -> ActionMode:
    """`name` as an `ActionMode` (configs carry plain strings), or the error that lists the modes."""
    for mode in MODES:
        if name == mode:
            return mode
    raise UnknownNameError("LLM action mode", name, list(MODES))


class LLMPolicy:
    """ReAct-style LLM agent over a backend.

    `rank` scores every admissible action by the model's log-likelihood in one batched forward
    pass (the usual choice for small models); `generate` samples free text, parsed and matched to
    the admissible actions, retried once with the error shown, else the first admissible action;
    `constrain` decodes greedily but can only spell an admissible action or the rollback tool (on
    ScienceWorld's ~1000 actions, where ranking them all is too slow and free text names objects
    that are not there). Unlike `generate`, it cannot send an action that the environment accepts
    but does not list (ScienceWorld's "move X in inventory to Y"; it spells "move X to Y").
    """

    def __init__(self, backend: Backend, mode: ActionMode = "rank", name: str = "llm") -> None:
        if mode not in MODES:
            raise UnknownNameError("LLM action mode", mode, list(MODES))
        self.backend, self.mode, self.name = backend, mode, name

    def fork(self, env: Env, k: int) -> LLMPolicy:
        """The same model and mode (the agent keeps no state between calls; ranking is greedy, so one
        continuation is what it would do)."""
        return LLMPolicy(self.backend, self.mode, self.name)

    def act(self, ctx: AgentContext) -> AgentAction:
        messages = agent_prompt(ctx.objective, ctx.memory.render(), ctx.history, ctx.observation, ctx.actions)
        if not ctx.actions:
            return AgentAction("respond", "no valid actions")
        warned = ctx.guidance.warnings(ctx.memory, ctx.history, ctx.observation)
        if self.mode == "rank" and len(ctx.actions) <= MAX_LISTED_ACTIONS:
            return self._rank(ctx, messages, warned)
        if self.mode == "constrain":
            return self._constrain(ctx, messages, warned)
        return self._generate(ctx, messages, warned)

    def _rank(self, ctx: AgentContext, messages: Messages, warned: dict[str, str]) -> AgentAction:
        """The likeliest admissible action, after the memory's penalties."""
        candidates = [f"Action: {a}" for a in ctx.actions]
        scores = self.backend.score(messages, candidates)
        penalties = ctx.guidance.penalties(candidates, warned)
        unguided = max(range(len(scores)), key=lambda i: scores[i])
        best = max(range(len(scores)), key=lambda i: scores[i] - penalties.get(i, 0.0))
        guided = _guided(ctx, warned, penalties, ctx.actions, unguided, best, tuple(scores[i] for i in penalties))
        return AgentAction("task", ctx.actions[best], prompt_tokens=content_tokens(messages), guided=guided)

    def _constrain(self, ctx: AgentContext, messages: Messages, warned: dict[str, str]) -> AgentAction:
        """Greedy decoding limited to the admissible actions (and the rollback tool); a warned action
        pays its penalty, or is not spelt at all under `hard`."""
        names = [*ctx.actions, "rollback"]
        choices = [f"Action: {a}" for a in names]
        penalties = ctx.guidance.penalties(choices, warned)
        allowed = [i for i in range(len(choices)) if penalties.get(i, 0.0) < EXCLUDED]
        pick, completion = self.backend.choose(
            messages, [choices[i] for i in allowed], [penalties.get(i, 0.0) for i in allowed] if penalties else None
        )
        best = allowed[pick]
        unguided = best
        if penalties:  # one more decode, only where the memory warned: what would it have done?
            unguided = self.backend.choose(messages, choices)[0]
        kind: Literal["task", "rollback"] = "rollback" if best == len(ctx.actions) else "task"
        return AgentAction(
            kind,
            names[best],
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            guided=_guided(ctx, warned, penalties, names, unguided, best),
        )

    def _generate(self, ctx: AgentContext, messages: Messages, warned: dict[str, str]) -> AgentAction:
        """Free text matched to an admissible action, retried once on a reply that names none. A
        warned action is rejected and redrawn (once under `soft`, twice under `hard`, after which the
        first admissible action the memory does not warn against is taken)."""
        p_tok = c_tok = parse_failures = 0
        redraws = {"off": 0, "soft": 1, "hard": 2}[ctx.guidance.mode] if warned else 0
        first: AgentAction | None = None
        hints = [_likely_replies(ctx)] if len(ctx.actions) <= MAX_HINTS else None
        while True:
            completion = self.backend.generate([messages], max_new_tokens=40, stop=["\n"], hints=hints)[0]
            p_tok += completion.prompt_tokens
            c_tok += completion.completion_tokens
            action, error = match_action(completion.text, ctx.actions)
            if action is None:
                parse_failures += 1
                if parse_failures < 2:
                    messages = _followup(messages, completion.text, f"{error}. Answer 'Action: <one valid action>'.")
                    continue
                action = AgentAction("task", next((a for a in ctx.actions if a.lower() not in warned), ctx.actions[0]))
                break
            key = action.text.strip().lower()
            if action.kind == "task" and key in warned and redraws:
                first = first or action
                redraws -= 1
                note = f"'{action.text}' failed here before ({warned[key]}). Choose a different action."
                messages = _followup(messages, completion.text, note + " Answer 'Action: <one valid action>'.")
                continue
            if action.kind == "task" and key in warned and ctx.guidance.mode == "hard":
                action = AgentAction("task", next((a for a in ctx.actions if a.lower() not in warned), action.text))
            break
        guided = None
        if first is not None:
            guided = GuidedChoice(
                ctx.guidance.mode,
                (first.text,),
                (warned[first.text.strip().lower()],),
                EXCLUDED if ctx.guidance.mode == "hard" else ctx.guidance.penalty,
                first.text,
                action.text,
            )
        return replace(
            action,
            prompt_tokens=p_tok,
            completion_tokens=c_tok,
            parse_failure=parse_failures > 0,
            guided=guided,
        )


def _likely_replies(ctx: AgentContext) -> list[str]:
    """What the agent is likely to answer, handed to the backend as decoding hints (a local model decodes
    along them in one pass while its choice stays among them; the reply is the same): the admissible
    actions, the rollback tool, and what it did before on this branch (a looping agent repeats itself,
    often with an action the state does not admit)."""
    actions = dict.fromkeys([*ctx.actions, "rollback", *(s.action for s in ctx.history)])
    return [f"Action: {a}" for a in actions]


def _followup(messages: Messages, reply: str, note: str) -> Messages:
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": note}]


def _guided(
    ctx: AgentContext,
    warned: dict[str, str],
    penalties: dict[int, float],
    names: list[str],
    unguided: int,
    chosen: int,
    scores: tuple[float, ...] = (),
) -> GuidedChoice | None:
    """The trace's record of a guided step (None when the memory warned against no candidate)."""
    if not penalties:
        return None
    hits = sorted(penalties)
    return GuidedChoice(
        ctx.guidance.mode,
        tuple(names[i] for i in hits),
        tuple(warned[names[i].strip().lower()] for i in hits),
        penalties[hits[0]],
        names[unguided],
        names[chosen],
        scores,
    )


def make_policy(
    spec: PolicySpec,
    env: Env,
    backend: Callable[[str], Backend],
    mode: str = "rank",
    error_rate: float = 0.15,
    seed: int = 0,
) -> Policy:
    """The agent a spec names, acting on `env`: the error-injected expert (its errors drawn from `seed`),
    or the LLM agent over `backend(model)` in action `mode`."""
    if not spec.is_llm:
        return NoisyExpertPolicy(env, error_rate, seed)
    return LLMPolicy(backend(spec.model), action_mode(mode), name=str(spec))
