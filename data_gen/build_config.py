"""The settings of `rir build-data`: which rollouts, how they are labelled in hindsight (whose values,
how many continuations, how ties are labelled) and how the datasets are cut. The labeller reads them as
the builder does, so they live apart from both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from data_gen.agent_values import AgentValue
from data_gen.hindsight import REVIEW_TIES
from rir_runtime.orchestration.executors import EXECUTORS, check_executor
from rir_runtime.values import AUTO_WIDTH, LOOP_REPEATS

LABEL_VALUES = ("expert", "agent", "agent-lesson")


@dataclass
class BuildConfig:
    rollouts: list[str] = field(default_factory=list, metadata={"help": "comma list of rollout run folders"})
    out: str = field(default="data/controller", metadata={"help": "output folder for the datasets"})
    max_prompt_tokens: int = field(default=1536, metadata={"help": "cut trajectories from the middle beyond this"})
    tokenizer: str = field(
        default="", metadata={"help": "model whose tokenizer counts tokens (default: ~4 chars/token)"}
    )
    bisect: bool = field(default=True, metadata={"help": "find restore points by bisection (irreversible errors)"})
    reflect_retries: int = field(default=2, metadata={"help": "K retries per candidate reflection"})
    reflect_points: int = field(default=1, metadata={"help": "recoveries per episode given reflection preferences"})
    points_per_episode: int = field(default=4, metadata={"help": "reviews labelled per episode (latest first)"})
    val_fraction: float = field(default=0.2, metadata={"help": "share of task variations held out for validation"})
    label_value: str = field(
        default="expert",
        metadata={
            "help": "whose chance to succeed from a checkpoint the labels compare: the environment's expert "
            "plan, or K continuations of the rollout's own agent (slower; right where the expert knows only "
            "a gold path); agent-lesson: as agent, with a recovery's reflection kept in its continuations' memory",
            "choices": list(LABEL_VALUES),
        },
    )
    run_label_values: list[str] = field(
        default_factory=list,
        metadata={"help": "per rollout folder, FOLDER_NAME=VALUE (e.g. rollout-tw=agent-lesson); others: label_value"},
    )
    value_rollouts: int = field(
        default=AgentValue.rollouts, metadata={"help": "agent values: continuations per checkpoint (K)"}
    )
    value_max_steps: int = field(
        default=AgentValue.max_steps, metadata={"help": "agent values: environment steps per continuation"}
    )
    value_loop_repeats: int = field(
        default=LOOP_REPEATS,
        metadata={
            "help": "agent values: a continuation whose agent repeats one step (or a pair) this many times with "
            "nothing changing is called lost (0: play it to its cap)"
        },
    )
    branch_width: int = field(
        default=AUTO_WIDTH,
        metadata={
            "help": "agent values: continuations played together, their agent calls batched (1: one at a time; "
            "0: 8 on a GPU, 1 on a CPU)"
        },
    )
    review_ties: str = field(
        default="continue",
        metadata={
            "help": "the review label where the values cannot tell recovering from continuing (within the "
            "margin): continue, or heuristic (the rule controller's decision; for truncated agent values, "
            "0 both ways on most reviews)",
            "choices": list(REVIEW_TIES),
        },
    )
    value_pairs_per_point: int = field(
        default=8,
        metadata={
            "help": "value controller rows (value_pref): option pairs per decision point, the best option against "
            "the worse ones nearest to it; 0: none"
        },
    )
    workers: int = field(default=1, metadata={"help": "episodes labelled in parallel (processes, or Ray actors)"})
    executor: str = field(
        default="local",
        metadata={
            "help": "where labelling runs: local processes, or ray (as in rir rollout)",
            "choices": list(EXECUTORS),
        },
    )
    ray_address: str = field(default="", metadata={"help": "address of a running Ray cluster; empty: start one"})

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("rollouts is empty: pass --rollouts DIR[,DIR...]")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError("val_fraction must be within (0, 1)")
        for value in [self.label_value, *self.run_values().values()]:
            if value not in LABEL_VALUES:
                raise ValueError(f"label value {value!r} is not one of {', '.join(LABEL_VALUES)}")
        if self.review_ties not in REVIEW_TIES:
            raise ValueError(f"review_ties {self.review_ties!r} is not one of {', '.join(REVIEW_TIES)}")
        if self.value_rollouts < 1 or self.value_max_steps < 1 or self.branch_width < 0:
            raise ValueError("value_rollouts and value_max_steps must be >= 1, branch_width >= 0 (0: by the device)")
        if self.value_loop_repeats < 0:
            raise ValueError("value_loop_repeats must be >= 0 (0: never call a continuation looping)")
        if self.workers < 1 or self.value_pairs_per_point < 0:
            raise ValueError("workers must be >= 1 and value_pairs_per_point >= 0")
        check_executor(self.executor, self.ray_address)

    def run_values(self) -> dict[str, str]:
        """`run_label_values` as {rollout folder name: label value}."""
        pairs = [item.partition("=") for item in self.run_label_values]
        if bad := [a for a, eq, b in pairs if not (eq and a and b)]:
            raise ValueError(f"run_label_values {bad} are not FOLDER_NAME=VALUE")
        return {a: b for a, _, b in pairs}

    def label_value_of(self, run: str) -> str:
        """The label value of a rollout folder's episodes."""
        return self.run_values().get(Path(run).name, self.label_value)
