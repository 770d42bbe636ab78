"""Behaviour-cloning data for the base agent: expert trajectories rendered in the LLM policy's prompt.

    rir train agent-sft --config configs/train/agent_sft_cpu.yaml     # builds this data, then trains

Each row is one decision of the environment's expert (TextWorld `policy_commands`, ScienceWorld
gold paths, the workshop planner) on a **train** variation, rendered by `render_agent`, the very
function `LLMPolicy` calls at inference, with the completion `Action: <expert action>`. A share
of episodes take one deliberate detour (an error-injected action, never trained on), so the agent
also sees states off the expert path. Some detours are then recovered as RIR recovers them: the
world is restored to just before the wrong action and the heuristic What writes its failure into
the memory block, so the agent learns to act with a lesson in view instead of ignoring it.

A source with `mistakes_of` (a trained agent, `llm:<adapter>`) adds DAgger-style rows: the agent
is asked at every expert state, and where its own action would lose the episode or drop the
score, the world is restored, the failure goes into memory and the expert's action is the label.
In these rows the memory is the only thing that tells the right action from the one the agent
would take, which random detours cannot teach. Test variations are refused.
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rir_runtime.agent import AgentContext, Policy
from rir_runtime.controllers import HeuristicController
from rir_runtime.decisions import Reflection
from rir_runtime.envs import Env, TaskSpec, make_env, parse_variations, resolve_tasks
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UserInputError
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import LLMPolicy, action_mode, agent_prompt, plausible_mistake
from rir_runtime.policy_spec import PolicySpec
from rir_runtime.prompts import DecisionContext, Messages

PREVIOUS = "previous"  # mistakes_of: the adapter of the previous round of a recipe


@dataclass
class AgentDataSource:
    """Expert episodes from one benchmark: train variations only."""

    env: str = "builtin"
    tasks: list[str] = field(default_factory=list)
    split: str = "train"
    variations: str = "0-19"
    # Information-gathering actions taken first, when admissible, before the expert's plan: the
    # planner already knows what they reveal (TextWorld's plan skips "examine cookbook"), the agent
    # does not. Only for environments whose expert replans from any state (TextWorld, builtin).
    opening: list[str] = field(default_factory=list)
    # DAgger: a trained agent (`llm:<adapter or model>`) asked at each expert state. Its harmful
    # actions (lost, score drop) are recovered into memory; only rows with a lesson in memory are kept.
    # In a round of `rir train agent`, `previous` is the adapter of the round before (resolved there).
    mistakes_of: str = ""
    policy_mode: str = "generate"  # how the agent acts at inference: rank, generate or constrain
    # Times each train episode of this source is written (validation: once). Oversamples a small
    # source, such as the few own-mistake rows among hundreds of expert rows.
    repeat: int = 1


@dataclass
class AgentDataConfig:
    sources: list[AgentDataSource] = field(default_factory=lambda: [AgentDataSource()])
    out: str = "data/agent"
    detour_share: float = 0.3
    # Of the detours, the share recovered by a restore with the failure kept in memory. Detours
    # where the expert has no plan from the wrong state (ScienceWorld) are always recovered.
    recovered_share: float = 0.5
    max_steps: int = 60
    val_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        for source in self.sources:
            guard_split(source.split)
            if source.repeat < 1:
                raise UserInputError(f"repeat must be at least 1, not {source.repeat}")
            spec = source.mistakes_of
            if spec and spec != PREVIOUS and not getattr(PolicySpec.try_parse(spec), "is_llm", False):
                raise UserInputError(
                    f"mistakes_of must name an LLM agent as 'llm:<adapter folder or model>', not '{spec}' "
                    f"(train one first: rir train agent-sft), or be '{PREVIOUS}' in a round of `rir train agent`"
                )
        for name in ("detour_share", "recovered_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")


def guard_split(split: str) -> None:
    """The agent is trained on train variations only; dev tunes, test is for final numbers."""
    if split != "train":
        raise UserInputError(
            f"agent SFT data must come from the train split, not '{split}': dev and test variations "
            "are held out for tuning and final numbers"
        )


def expert_episode(
    env: Env,
    task: TaskSpec,
    detour: float | None,
    max_steps: int,
    rng: random.Random,
    opening: tuple[str, ...] = (),
    recover: bool = False,
    agent: Policy | None = None,
) -> list[dict]:
    """Rows of one expert episode. With `detour` (a fraction of the way along the expert's first
    plan), one plausible wrong action is taken at that step instead, and not trained on. Then
    either the expert plans again from the new state, or (`recover`, or an expert that cannot
    replan) the world is restored to before it and the heuristic What's reflection on it joins
    the memory. `opening` actions come before the plan, each once, while admissible.

    With an `agent`, it is asked at every state instead; each of its actions that loses the
    episode or drops the score is recovered the same way (a harmless other route is undone and
    forgotten), and only the rows with a lesson in memory are returned."""
    obs = env.reset(task)
    history: tuple[Step, ...] = ()
    memory = ReflectionMemory(objective=obs.objective)
    observation, rows = obs.text, []
    detour_at = None if detour is None else int(detour * (len(env.expert_actions()) + len(opening)))
    for t in range(max_steps):
        plan = env.expert_actions()
        if not plan:
            break
        actions = env.admissible_actions()
        done = {s.action for s in history}
        plan = [a for a in opening if a in actions and a not in done][:1] + plan
        wrong = None
        if agent is not None:
            wrong = _own_action(agent, task, obs.objective, memory, history, observation, actions)
        elif t == detour_at:
            wrong = plausible_mistake(plan[0], actions, task.key, str(rng.random()))
        if wrong and wrong != plan[0]:
            score = history[-1].score if history else obs.score
            went_on = _detour(env, wrong, history, score, memory, obs.objective, agent is not None, recover)
            if went_on is not None:
                history, observation, stuck = went_on
                if stuck:
                    break  # an unrecoverable detour teaches nothing about getting back on track
                continue
        if agent is None or memory.failures:  # an agent's rows without a lesson repeat plain cloning
            prompt = agent_prompt(obs.objective, memory.render(), history, observation, actions)
            detoured = agent is not None or (detour_at is not None and t >= detour_at)
            rows.append(_clone_row(task, prompt, plan[0], len(history), detoured, bool(memory.failures)))
        result = env.step(plan[0])
        history += (Step(len(history), plan[0], result.observation, result.score, result.won, result.lost),)
        observation = result.observation
        if result.done:
            break
    return rows


def _detour(
    env: Env,
    wrong: str,
    history: tuple[Step, ...],
    score: float,
    memory: ReflectionMemory,
    objective: str,
    by_agent: bool,
    recover: bool,
) -> tuple[tuple[Step, ...], str, bool] | None:
    """Take the wrong action from where the branch stands (at `score`). A mistake is undone: the world
    is restored to before it and the heuristic What's reflection on it joins the memory; an agent's
    action that neither loses nor drops the score is another route, undone and forgotten. None then.
    Where the expert replans instead (no agent, no `recover`), the branch goes on from the wrong state:
    (the branch with it, its observation, whether the episode can no longer go on from there)."""
    before = env.checkpoint()
    result = env.step(wrong)
    detoured = history + (Step(len(history), wrong, result.observation, result.score, result.won, result.lost),)
    if by_agent and not (result.lost or result.score < score):
        env.restore(before)  # another route, not a mistake: the expert's label stands as is
        return None
    if by_agent or recover or not env.expert_replans:
        memory.add(_reflection(objective, memory, detoured, len(history)))
        env.restore(before)
        return None
    return detoured, result.observation, result.done or not env.expert_actions()


def _clone_row(task: TaskSpec, prompt: Messages, label: str, step: int, detour: bool, recovered: bool) -> dict:
    """One agent SFT row: the agent's prompt, the expert's next action as the answer."""
    meta = {
        "env": task.env,
        "task": task.task,
        "split": task.split,
        "variation": task.variation,
        "step": step,
        "detour": detour,
        "recovered": recovered,
        "label": label,
    }
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": f"Action: {label}"}], "meta": meta}


def _agent(spec: str, mode: str) -> LLMPolicy:
    """The trained agent whose own mistakes a DAgger source records (`llm:<adapter or model>`)."""
    from rir_runtime.llm import make_backend

    return LLMPolicy(make_backend(PolicySpec.parse(spec).model), action_mode(mode), name=spec)


def _own_action(
    agent: Policy,
    task: TaskSpec,
    objective: str,
    memory: ReflectionMemory,
    history: tuple[Step, ...],
    observation: str,
    actions: list[str],
) -> str | None:
    """The task action `agent` takes in this state, seeing exactly what it sees at inference."""
    action = agent.act(AgentContext(task.key, objective, memory, history, observation, lambda: actions))
    return action.text if action.kind == "task" else None


def _reflection(objective: str, memory: ReflectionMemory, history: tuple[Step, ...], restore_point: int) -> Reflection:
    """What RIR's heuristic What keeps when the branch is rolled back to `restore_point`."""
    last = history[-1]
    ctx = DecisionContext(
        task="",
        objective=objective,
        memory=memory.render(),
        history=history,
        observation=last.observation,
        score=last.score,
        restore_point=restore_point,
    )
    return HeuristicController().reflect(ctx).value


def build_agent_data(cfg: AgentDataConfig) -> dict[str, int]:
    """Write a `DatasetDict` (train/validation split by variation) with a dataset card."""
    from datasets import Dataset, DatasetDict
    from tqdm import tqdm

    from data_gen.cards import dataset_metadata, front_matter

    if any(source.mistakes_of == PREVIOUS for source in cfg.sources):
        raise UserInputError(
            f"mistakes_of: {PREVIOUS} names the adapter of the previous round of `rir train agent`; "
            "outside a recipe, name the agent as 'llm:<adapter folder>'"
        )
    rng = random.Random(cfg.seed)
    train, validation = [], []
    for source in cfg.sources:
        guard_split(source.split)
        env = make_env(source.env)
        try:
            specs = resolve_tasks(env, source.tasks or None, source.split, parse_variations(source.variations))
            held_out = {s.key for s in specs[:: max(2, round(1 / cfg.val_fraction))]} if len(specs) > 1 else set()
            agent = _agent(source.mistakes_of, source.policy_mode) if source.mistakes_of else None
            desc = f"{'own mistakes' if agent else 'expert episodes'} ({source.env})"
            for spec in tqdm(specs, desc=desc, file=sys.stderr, mininterval=2.0):
                detour = rng.random() if rng.random() < cfg.detour_share else None
                recover = rng.random() < cfg.recovered_share
                rows = expert_episode(env, spec, detour, cfg.max_steps, rng, tuple(source.opening), recover, agent)
                if spec.key in held_out:
                    validation.extend(rows)
                else:
                    train.extend(rows * source.repeat)
        finally:
            env.close()
    if not train:
        raise UserInputError("no expert steps were produced: check the sources' tasks and variations")
    out = Path(cfg.out)
    splits = {"train": train, "validation": validation}
    DatasetDict({k: Dataset.from_list(v) for k, v in splits.items() if v}).save_to_disk(str(out / "agent_sft"))
    envs = sorted({source.env for source in cfg.sources})
    tags = ["sft", "prompt-completion", "agent", "behaviour-cloning", *envs]
    metadata = dataset_metadata({k: len(v) for k, v in splits.items()}, pretty_name="RIR agent_sft", tags=tags)
    card = [
        front_matter(metadata),
        "# agent_sft",
        "",
        "Behaviour-cloning rows: expert actions rendered in the LLM policy's prompt "
        "(`rir_runtime.policies.agent_prompt`). Train split variations only; validation holds other "
        "variations.",
        "",
        "| split | rows | after a detour | with a failure in memory |",
        "| --- | ---: | ---: | ---: |",
    ]
    card += [
        f"| {k} | {len(v)} | {sum(r['meta']['detour'] for r in v)} | {sum(r['meta']['recovered'] for r in v)} |"
        for k, v in splits.items()
    ]
    card += ["", f"Config: `{asdict(cfg)}`", ""]
    (out / "agent_sft" / "README.md").write_text("\n".join(card))
    return {k: len(v) for k, v in splits.items()}
