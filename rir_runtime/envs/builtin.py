"""The built-in workshop: a tiny, deterministic, pure-Python benchmark with real recovery problems.

A procedurally generated workshop (seeded by split and variation) asks the agent to prepare a
few ingredients, each with one specific process, and then `combine` them at the bench. It has
the two kinds of mistakes recovery is about:

- *irreversible traps*: some ingredients are volatile; heating one ends the episode at once
  (`lost`, a visible symptom);
- *silent errors*: processing an ingredient the wrong way answers exactly like the right way.
  The symptom shows only later, when `combine` fails and the episode is lost. The cause lies
  several steps before the symptom, which is what restore localisation has to find.

It restores by replay (`ReplayEnv`) like ScienceWorld, so every runtime test exercises the
replay-and-verify path in milliseconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rir_runtime.envs.base import Observation, ReplayEnv, Split, StepResult, TaskSpec
from rir_runtime.errors import UnknownNameError, UserInputError

PROCESSES = ("slice", "heat", "chill", "grind")
ROOMS = ("bench", "pantry", "cellar", "garden")
FOODS = (
    "carrot",
    "onion",
    "pepper",
    "apple",
    "walnut",
    "basil",
    "ginger",
    "garlic",
    "lemon",
    "potato",
    "mint",
    "fennel",
    "radish",
    "cocoa",
    "almond",
    "leek",
)
TASKS = {"workshop-2": 2, "workshop-3": 3, "workshop-4": 4}
SPLIT_SEED_BASE = {"train": 0, "dev": 100_000, "test": 200_000}
VARIATIONS_PER_SPLIT = 10_000
MAX_SCORE = 100.0


@dataclass
class Ingredient:
    """One food item; `needed` is the process the recipe wants, `done` the one applied (if any)."""

    name: str
    room: str
    needed: str | None  # None: a distractor the recipe does not use
    volatile: bool = False
    done: str | None = None
    held: bool = False


@dataclass
class WorkshopState:
    room: str = "bench"
    read_recipe: bool = False
    ingredients: dict[str, Ingredient] = field(default_factory=dict)
    over: bool = False


def generate(task: TaskSpec) -> dict[str, Ingredient]:
    """The workshop layout for one task: recipe ingredients, their processes, distractors."""
    n_needed = TASKS[task.task]
    rng = random.Random(f"workshop/{task.task}/{SPLIT_SEED_BASE[task.split] + task.variation}")
    foods = rng.sample(FOODS, n_needed + 2)
    items: dict[str, Ingredient] = {}
    for i, food in enumerate(foods):
        needed = rng.choice(PROCESSES) if i < n_needed else None
        # Volatile ingredients never need heat, so heating one is always a mistake.
        volatile = needed != "heat" and rng.random() < 0.4
        items[food] = Ingredient(food, rng.choice(ROOMS[1:]), needed, volatile)
    return items


class WorkshopEnv(ReplayEnv):
    """The built-in workshop environment (`builtin`)."""

    name = "builtin"

    def __init__(self) -> None:
        super().__init__()
        self._state = WorkshopState()

    def spawn(self) -> WorkshopEnv:
        return WorkshopEnv()

    @classmethod
    def task_names(cls) -> list[str]:
        return list(TASKS)

    def num_variations(self, task: str, split: Split) -> int:
        if task not in TASKS:
            raise UnknownNameError("builtin task", task, list(TASKS))
        return VARIATIONS_PER_SPLIT

    def max_score(self) -> float | None:
        return MAX_SCORE

    # --- engine -----------------------------------------------------------------------
    def _reset_engine(self, task: TaskSpec) -> Observation:
        if task.task not in TASKS:
            raise UnknownNameError("builtin task", task.task, list(TASKS))
        if not 0 <= task.variation < VARIATIONS_PER_SPLIT or task.split not in SPLIT_SEED_BASE:
            raise UserInputError(f"builtin variations are 0-{VARIATIONS_PER_SPLIT - 1} per split; got {task}")
        self._state = WorkshopState(ingredients=generate(task))
        objective = (
            "Prepare the recipe written in the workshop notebook and combine it at the bench. "
            "Each ingredient needs exactly one process; a wrong process ruins the dish."
        )
        return Observation(text=self._look(), objective=objective, score=0.0)

    def _step_engine(self, action: str) -> StepResult:
        s = self._state
        if s.over:  # a no-op: the score stays where the last real step left it
            return StepResult("The episode is over.", reward=0.0, score=self._score, done=True, won=False, lost=False)
        verb, _, arg = action.strip().lower().partition(" ")
        item = s.ingredients.get(arg)
        if action.strip().lower() == "read notebook" and s.room == "bench":
            s.read_recipe = True
            return self._result(self._recipe_text())
        if verb == "look":
            return self._result(self._look())
        if verb == "inventory":
            held = [i.name for i in s.ingredients.values() if i.held]
            return self._result("You carry: " + (", ".join(held) or "nothing") + ".")
        if verb == "go" and arg.startswith("to ") and arg[3:] in ROOMS:
            s.room = arg[3:]
            return self._result(self._look())
        if verb == "take" and item and item.room == s.room and not item.held:
            item.held = True
            return self._result(f"You take the {item.name}.")
        if verb in PROCESSES and item and item.held and item.done is None:
            if verb == "heat" and item.volatile:
                s.over = True
                return self._result(f"The {item.name} bursts into flames. The workshop is ruined.", lost=True)
            item.done = verb
            # Deliberately the same words whether or not this was the right process: a silent error.
            return self._result(f"You {verb} the {item.name}.")
        if verb == "combine" and s.room == "bench":
            return self._combine()
        return self._result("Nothing happens. That action is not possible here.")

    def _combine(self) -> StepResult:
        s = self._state
        needed = [i for i in s.ingredients.values() if i.needed]
        if not all(i.held and i.done for i in needed):
            return self._result("The recipe is not ready: some ingredients are missing or unprepared.")
        s.over = True
        if all(i.done == i.needed for i in needed):
            return self._result("You combine the ingredients. The dish is perfect!", won=True)
        return self._result("You combine the ingredients. The dish is inedible; the workshop closes.", lost=True)

    def _result(self, text: str, won: bool = False, lost: bool = False) -> StepResult:
        score = MAX_SCORE if won else self._progress()
        if lost:
            score = -MAX_SCORE
        return StepResult(
            observation=text,
            reward=score - self._score,
            score=score,
            done=won or lost or self._state.over,
            won=won,
            lost=lost,
        )

    def _progress(self) -> float:
        """Partial score: reading the recipe and each processed recipe ingredient. A wrong process
        scores like the right one, so the score never reveals a silent error before `combine`."""
        s = self._state
        needed = [i for i in s.ingredients.values() if i.needed]
        points = int(s.read_recipe) + sum(i.held and i.done is not None for i in needed)
        return round(80.0 * points / (len(needed) + 1), 2)

    def _look(self) -> str:
        s = self._state
        here = sorted(i.name for i in s.ingredients.values() if i.room == s.room and not i.held)
        exits = ", ".join(r for r in ROOMS if r != s.room)
        things = ", ".join(here) if here else "nothing useful"
        extra = " A notebook lies on the bench." if s.room == "bench" else ""
        return f"You are at the {s.room}. You see {things}.{extra} Exits: {exits}."

    def _recipe_text(self) -> str:
        needed = [i for i in self._state.ingredients.values() if i.needed]
        steps = "; ".join(f"{i.needed} the {i.name}" for i in needed)
        return f"The notebook reads: {steps}; then combine everything at the bench."

    # --- actions ------------------------------------------------------------------------
    def admissible_actions(self) -> list[str]:
        s = self._state
        if s.over:
            return []
        acts = ["look", "inventory"] + [f"go to {r}" for r in ROOMS if r != s.room]
        for i in s.ingredients.values():
            if i.room == s.room and not i.held:
                acts.append(f"take {i.name}")
            if i.held and i.done is None:
                acts += [f"{p} {i.name}" for p in PROCESSES]
        if s.room == "bench":
            acts += ["read notebook", "combine"]
        return sorted(acts)

    def expert_actions(self) -> list[str]:
        """Shortest known plan from here; [] once a silent error or trap made success impossible."""
        s = self._state
        needed = [i for i in s.ingredients.values() if i.needed]
        if s.over or any(i.done and i.done != i.needed for i in needed):
            return []
        plan: list[str] = []
        room = s.room
        if not s.read_recipe:
            plan += [] if room == "bench" else ["go to bench"]
            plan.append("read notebook")
            room = "bench"
        for i in needed:
            if not i.held:
                if room != i.room:
                    plan.append(f"go to {i.room}")
                    room = i.room
                plan.append(f"take {i.name}")
            if i.done is None:
                plan.append(f"{i.needed} {i.name}")
        if room != "bench":
            plan.append("go to bench")
        return plan + ["combine"]

    # Used by the error-injected expert and tests: the ground truth of a silent error.
    def ruined_ingredients(self) -> list[str]:
        """Names of recipe ingredients processed the wrong way (invisible to the agent)."""
        return sorted(i.name for i in self._state.ingredients.values() if i.needed and i.done and i.done != i.needed)
