"""The behaviour-cloned agent: data rendered by the policy's own prompt function, the split guard,
and a tiny agent adapter that trains, loads as a policy, acts, and is refused as a controller."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_gen.agent_data import AgentDataConfig, AgentDataSource, build_agent_data, expert_episode
from rir_runtime.agent import AgentContext
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.errors import UserInputError
from rir_runtime.memory import ReflectionMemory
from rir_runtime.orchestration.config import build_config
from rir_runtime.policies import LLMPolicy

TASK = TaskSpec("builtin", "workshop-3", "train", 4)


@dataclass
class Reply:
    text: str
    prompt_tokens: int = 1
    completion_tokens: int = 1


class CaptureBackend:
    supports_scoring = False

    def __init__(self) -> None:
        self.prompts: list = []

    def generate(self, prompts, **kwargs):
        self.prompts += prompts
        return [Reply("Action: look") for _ in prompts]


def test_agent_rows_render_exactly_what_the_policy_sees() -> None:
    import random

    env = WorkshopEnv()
    rows = expert_episode(env, TASK, None, 60, random.Random(0))
    assert len(rows) > 5 and rows[-1]["completion"][0]["content"] == "Action: combine"
    # replay the expert to step 3 and ask the policy: its prompt must equal the training row's
    obs = env.reset(TASK)
    from rir_runtime.envs.checkpoints import Step

    history: tuple[Step, ...] = ()
    observation = obs.text
    for row in rows[:3]:
        action = row["completion"][0]["content"].removeprefix("Action: ")
        result = env.step(action)
        history += (Step(len(history), action, result.observation, result.score),)
        observation = result.observation
    backend = CaptureBackend()
    LLMPolicy(backend, "generate").act(
        AgentContext(
            TASK.key,
            obs.objective,
            ReflectionMemory(objective=obs.objective),
            history,
            observation,
            env.admissible_actions,
        )
    )
    assert backend.prompts[0] == rows[3]["prompt"]


def test_split_guard_refuses_dev_and_test() -> None:
    for split in ("test", "dev"):
        with pytest.raises(UserInputError, match="must come from the train split"):
            build_config(AgentDataConfig, {"sources": [{"env": "builtin", "split": split, "variations": "0-3"}]})


@pytest.fixture(scope="module")
def agent_adapter(tmp_path_factory) -> Path:
    from train.agent_sft import main

    root = tmp_path_factory.mktemp("agent")
    cfg = root / "agent_data.yaml"
    cfg.write_text("sources:\n  - {env: builtin, tasks: [workshop-2], split: train, variations: 0-5}\n")
    out = root / "adapter"
    main(
        [
            "--config",
            "configs/train/agent_sft_cpu.yaml",
            "--agent-data",
            str(cfg),
            "--model",
            "tiny-random-llama",
            "--data",
            str(root / "data"),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_strategy",
            "no",
            "--eval_on_start",
            "false",
            "--save_strategy",
            "no",
            "--per_device_train_batch_size",
            "2",
            "--learning_rate",
            "0.01",
        ]
    )
    return out


def test_tiny_agent_adapter_trains_loads_as_policy_and_acts(agent_adapter: Path) -> None:
    import json

    from rir_runtime.llm import make_backend

    card = json.loads((agent_adapter / "rir_controller.json").read_text())
    assert card["kind"] == "agent" and card["decision_types"] == ["agent"]
    env = WorkshopEnv()
    obs = env.reset(TaskSpec("builtin", "workshop-2", "dev", 0))
    backend = make_backend(str(agent_adapter))
    ctx = AgentContext("x", obs.objective, ReflectionMemory(), (), obs.text, env.admissible_actions)
    ranked = LLMPolicy(backend, "rank").act(ctx)
    assert ranked.kind == "task" and ranked.text in env.admissible_actions()
    spelled = LLMPolicy(backend, "constrain").act(ctx)  # the PEFT model under a token trie
    assert spelled.kind == "rollback" or spelled.text in env.admissible_actions()
    assert spelled.completion_tokens > 1 and not spelled.parse_failure


def test_agent_and_controller_adapters_are_not_interchangeable(agent_adapter: Path) -> None:
    from rir_runtime.controllers import check_controller_name
    from rir_runtime.llm.card import read_card

    with pytest.raises(UserInputError, match="is an agent adapter, not a controller adapter.*--policy llm:"):
        check_controller_name(f"tuned:{agent_adapter}")
    card = agent_adapter / "rir_controller.json"
    text = card.read_text()
    try:
        card.write_text(text.replace('"kind": "agent"', '"kind": "controller"'))
        with pytest.raises(UserInputError, match="is a controller adapter, not an agent adapter.*--controller tuned:"):
            read_card(agent_adapter, expect="agent")
    finally:
        card.write_text(text)


def test_no_expert_data_for_an_empty_selection(tmp_path: Path) -> None:
    cfg = AgentDataConfig(
        sources=[AgentDataSource("builtin", ["workshop-2"], "train", "0")], out=str(tmp_path), max_steps=0
    )
    with pytest.raises(UserInputError, match="no expert steps"):
        build_agent_data(cfg)
    assert not os.listdir(tmp_path)


def test_opening_actions_come_first_once_then_the_expert_plan() -> None:
    import random

    from rir_runtime.envs import TaskSpec, make_env

    env = make_env("builtin")
    task = TaskSpec("builtin", "workshop-2", "train", 0)
    plain = [r["meta"]["label"] for r in expert_episode(env, task, None, 60, random.Random(0))]
    opened = [r["meta"]["label"] for r in expert_episode(env, task, None, 60, random.Random(0), opening=("look",))]
    assert opened == ["look", *plain]


def test_recovered_detour_restores_the_world_and_keeps_the_failure_in_memory() -> None:
    import random

    from rir_runtime.envs import TaskSpec, make_env

    env = make_env("builtin")
    task = TaskSpec("builtin", "workshop-3", "train", 4)
    plain = expert_episode(env, task, None, 60, random.Random(0))
    recovered = expert_episode(env, task, 0.5, 60, random.Random(0), recover=True)
    kept = expert_episode(env, task, 0.5, 60, random.Random(0), recover=False)
    # restored: the same expert path, the wrong action gone from the history, its lesson in memory
    assert [r["meta"]["label"] for r in recovered] == [r["meta"]["label"] for r in plain]
    first = next(i for i, r in enumerate(recovered) if r["meta"]["recovered"])
    assert first > 0 and all(r["meta"]["recovered"] for r in recovered[first:])
    before, after = recovered[first]["prompt"][1]["content"], plain[first]["prompt"][1]["content"]
    assert "Lessons from earlier attempts:" in before and "Lessons from earlier attempts:" not in after
    wrong = before.split("Lesson: in that situation do not '")[1].split("'")[0]
    assert wrong != recovered[first]["meta"]["label"]
    assert before.split("Recent steps:")[1] == after.split("Recent steps:")[1]  # no trace of the detour
    # not recovered: the expert replans from the wrong state, which stays in the history
    assert not any(r["meta"]["recovered"] for r in kept)
    assert wrong in kept[first]["prompt"][1]["content"].split("Recent steps:")[1]


class HeatFirstAgent:
    """A stub agent that heats whatever it can: fatal for a volatile ingredient, else harmless."""

    name = "heat-first"

    def act(self, ctx: AgentContext):
        from rir_runtime.agent import AgentAction

        heats = [a for a in ctx.actions if a.startswith("heat ")]
        return AgentAction("task", heats[0] if heats else ctx.actions[0])


def test_own_mistakes_are_recovered_into_memory_and_only_lesson_rows_kept() -> None:
    import random

    from rir_runtime.envs import make_env

    env = make_env("builtin")
    task = TaskSpec("builtin", "workshop-3", "train", 0)  # its almond bursts into flames when heated
    plain = [r["meta"]["label"] for r in expert_episode(env, task, None, 60, random.Random(0))]
    rows = expert_episode(env, task, None, 60, random.Random(0), agent=HeatFirstAgent())
    assert rows and all(r["meta"]["recovered"] for r in rows)
    assert [r["meta"]["label"] for r in rows] == plain[-len(rows) :]  # the expert's path, restored
    first = rows[0]["prompt"][1]["content"]
    assert "do not 'heat almond'" in first and "bursts into flames" not in first.split("Recent steps:")[1]
    # heating a stable ingredient is another route, not a mistake: undone and never a lesson
    assert (
        expert_episode(
            env, TaskSpec("builtin", "workshop-3", "train", 2), None, 60, random.Random(0), agent=HeatFirstAgent()
        )
        == []
    )


def test_mistakes_of_must_name_an_llm_agent(tmp_path: Path) -> None:
    for spec in ("heuristic", "llm:"):
        source = AgentDataSource("builtin", ["workshop-2"], "train", "0", mistakes_of=spec)
        with pytest.raises(UserInputError, match="mistakes_of must name an LLM agent as 'llm:"):
            AgentDataConfig(sources=[source], out=str(tmp_path))


def test_repeat_oversamples_train_episodes_only(tmp_path: Path) -> None:
    from datasets import load_from_disk

    def rows(repeat: int) -> tuple[int, int]:
        source = AgentDataSource("builtin", ["workshop-2"], "train", "0-6", repeat=repeat)
        build_agent_data(AgentDataConfig(sources=[source], out=str(tmp_path / str(repeat)), detour_share=0.0))
        d = load_from_disk(str(tmp_path / str(repeat) / "agent_sft"))
        return len(d["train"]), len(d["validation"])

    (train1, val1), (train3, val3) = rows(1), rows(3)
    assert train3 == 3 * train1 and val3 == val1 > 0
    with pytest.raises(UserInputError, match="repeat must be at least 1"):
        AgentDataConfig(sources=[AgentDataSource("builtin", ["workshop-2"], "train", "0", repeat=0)])
