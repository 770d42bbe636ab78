"""TextWorld cooking games (`tw-make tw-cooking`), generated locally from fixed seeds and cached.

Tasks are difficulty presets (`PRESETS`, the tw-make flags); a variation is a game seed inside the
split's seed range, and the split also selects tw-cooking's own food split (dev -> `valid`), so dev
and test games use foods/preparations unseen in train. Wrong cooking or cutting loses the game.
Games are cached as `<cache>/textworld/<preset>/<split>/<seed>.z8` (+ `.json`, which TextWorld
needs for admissible and policy commands); `<cache>` is `cache_dir`, `$RIR_CACHE_DIR` or ~/.cache/rir.

Checkpoints are native: the z-machine state (Jericho `get_state`) plus a copy of TextWorld's
Python-side tracking (quest progression that yields `admissible_commands`/`policy_commands`).
`env.copy()` would also work but re-loads the Frotz library twice and rebuilds the quest trees
(0.6-1.5 s); this takes milliseconds.
If a native capture or restore fails, we fall back to replay-and-verify (`ReplayEnv`).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rir_runtime.cache import cache_dir as rir_cache_dir
from rir_runtime.envs.base import Observation, ReplayEnv, Snapshot, Split, StepResult, TaskSpec
from rir_runtime.errors import DependencyMissingError, RestoreError, RIRError, UnknownNameError, UserInputError

#: task name -> tw-make tw-cooking flags (the names are the contract for `--tasks`)
PRESETS: dict[str, tuple[str, ...]] = {
    "recipe1": ("--recipe", "1", "--take", "1", "--go", "1"),
    "recipe1-prep": ("--recipe", "1", "--take", "1", "--go", "1", "--open", "--cook", "--cut"),
    "recipe2": ("--recipe", "2", "--take", "2", "--go", "6", "--open", "--cook", "--cut"),
    "recipe3": ("--recipe", "3", "--take", "3", "--go", "9", "--open", "--cook", "--cut"),
    "recipe3-drop": ("--recipe", "3", "--take", "3", "--go", "9", "--open", "--cook", "--cut", "--drop"),
    "recipe4": ("--recipe", "4", "--take", "4", "--go", "12", "--open", "--cook", "--cut"),
}
SPLIT_SEED_BASE = {"train": 10_000, "dev": 20_000, "test": 30_000}
TW_SPLIT = {"train": "train", "dev": "valid", "test": "test"}
VARIATIONS_PER_SPLIT = 1_000
GAME_OVER = "The game is over. Restore a checkpoint or reset to play on."


def game_seed(split: str, variation: int) -> int:
    """Disjoint seed ranges per split, so no train game can appear in dev or test."""
    return SPLIT_SEED_BASE[split] + variation


def _clean(feedback: str, objective: str = "") -> str:
    """Drop the ASCII-art banner and the trailing `>` prompt with its status line (`-= Room =-1/4`)."""
    text = feedback or ""
    cut = text.rfind("\n>")
    if cut >= 0 and "\n" not in text[cut + 2 :]:
        text = text[:cut]
    start = text.find(objective) if objective else -1
    if start > 0 and not re.search("[A-Za-z]", text[:start]):
        text = text[start:]
    return text.strip()


def _copy_progression(gp: Any) -> Any:
    """Like `GameProgression.copy()`, which rebuilds every quest tree (~0.2 s on 12 rooms), in ~5 ms:
    share what never changes (game, kb, actions, tree elements, as upstream does), copy the rest."""

    def fresh(obj: Any, **changes: Any) -> Any:
        new = copy.copy(obj)
        new.__dict__.update(changes)
        return new

    def event(e: Any) -> Any:
        t = e._tree
        return fresh(
            e,
            _tree=fresh(
                t,
                roots=[r.copy() for r in t.roots],
                _leaves_values=list(t._leaves_values),
                _leaves_elements=list(t._leaves_elements),
            ),
        )

    quests = [
        fresh(q, win_events=[event(e) for e in q.win_events], fail_events=[event(e) for e in q.fail_events])
        for q in gp.quest_progressions
    ]
    return fresh(gp, state=gp.state.copy(), quest_progressions=quests)


def _clone(value: Any) -> Any:
    """Copy what later steps mutate; keep immutable game data (Game, Inform7Game) by reference."""
    from textworld.core import GameState
    from textworld.generator.game import GameProgression

    if isinstance(value, GameProgression):
        return _copy_progression(value)
    if isinstance(value, GameState):
        return GameState(value)
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


@dataclass(frozen=True)
class NativeState:
    """Engine-native payload: z-machine state, wrapper-layer attributes, and our cached step info."""

    frotz: tuple
    layers: tuple[dict[str, Any], ...]
    last: dict[str, Any]


class TextWorldCookingEnv(ReplayEnv):
    """TextWorld cooking games behind the `Env` contract; native snapshots, replay as fallback."""

    name = "textworld-cooking"

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, native_snapshots: bool = True) -> None:
        super().__init__()
        try:
            import textworld  # noqa: F401
        except ImportError as exc:
            raise DependencyMissingError(
                f"textworld-cooking needs TextWorld ({exc}); install it with `pip install textworld==1.7.0`"
            ) from None
        self.cache_dir = rir_cache_dir("textworld", root=cache_dir)
        self.native_snapshots = native_snapshots
        self.native_failures = 0  # native captures/restores that failed and fell back to replay
        self._env: Any = None
        self._path: Path | None = None
        self._last: dict[str, Any] = {}
        self._initial: NativeState | None = None  # the loaded game's state right after reset

    def spawn(self) -> TextWorldCookingEnv:
        """Another engine over the same game cache (a game loads on its first reset, 0.05-0.6 s)."""
        return TextWorldCookingEnv(self.cache_dir.parent, self.native_snapshots)

    @classmethod
    def task_names(cls) -> list[str]:
        return list(PRESETS)

    def num_variations(self, task: str, split: Split) -> int:
        if task not in PRESETS:
            raise UnknownNameError(f"{self.name} task", task, list(PRESETS))
        return VARIATIONS_PER_SPLIT

    # --- game files -----------------------------------------------------------------------
    def game_file(self, task: TaskSpec) -> Path:
        """The cached `.z8` for `task`, generated on first use (its `.json` sits next to it)."""
        if not 0 <= task.variation < self.num_variations(task.task, task.split):
            raise UserInputError(f"variation {task.variation} of {task.key} is outside 0-{VARIATIONS_PER_SPLIT - 1}")
        if task.split not in SPLIT_SEED_BASE:
            raise UnknownNameError("split", task.split, list(SPLIT_SEED_BASE))
        seed = game_seed(task.split, task.variation)
        path = self.cache_dir / task.task / task.split / f"{seed}.z8"
        if not (path.is_file() and path.with_suffix(".json").is_file()):
            self._generate(task.task, task.split, seed, path)
        return path

    def _generate(self, preset: str, split: str, seed: int, path: Path) -> None:
        """Generate in a private temp folder, then rename: a killed run leaves no half-written game."""
        import textworld
        from textworld.challenges.tw_cooking.cooking import build_argparser, make
        from textworld.generator import compile_game

        settings = vars(build_argparser().parse_args(list(PRESETS[preset])))
        settings.update(recipe_seed=seed, split=TW_SPLIT[split])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{seed}-", dir=path.parent))
        try:
            options = textworld.GameOptions()
            options.seeds, options.path, options.force_recompile = seed, str(tmp / path.name), True
            compile_game(make(settings, options), options)
            os.replace(tmp / path.with_suffix(".json").name, path.with_suffix(".json"))
            os.replace(tmp / path.name, path)  # the .z8 appears last: its presence marks a complete game
        except Exception as exc:
            raise RIRError(f"generating TextWorld game {preset}/{split}/{seed} failed: {exc!r}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _load(self, task: TaskSpec) -> None:
        """Start the engine on `task`'s game; a corrupt cached game is regenerated once."""
        import textworld

        path = self.game_file(task)
        if self._env is not None and self._path == path:
            return
        self.close()
        infos = textworld.EnvInfos(
            admissible_commands=True,
            policy_commands=True,
            score=True,
            max_score=True,
            won=True,
            lost=True,
            objective=True,
        )
        for attempt in range(2):
            try:
                data = path.read_bytes()  # z-machine v8 header check first: Frotz may crash on a truncated file
                if len(data) < 64 or data[0] != 8 or len(data) < int.from_bytes(data[0x1A:0x1C], "big") * 8:
                    raise ValueError("truncated or not a z-machine v8 story file")
                self._env = textworld.start(str(path), request_infos=infos)
                self._env.seed(1)  # fixed Frotz RNG, so replays are deterministic
                self._path = path
                return
            except Exception as exc:
                if attempt:
                    raise RIRError(
                        f"cached TextWorld game {path} is unloadable ({exc!r}); delete "
                        f"{path} and {path.with_suffix('.json')} to regenerate it"
                    ) from exc
                path.unlink(missing_ok=True)
                self._generate(task.task, task.split, game_seed(task.split, task.variation), path)

    # --- engine ---------------------------------------------------------------------------
    def _remember(self, gs: Any, text: str) -> None:
        self._last = {
            "text": text,
            "score": float(gs.score or 0),
            "max_score": float(gs.max_score or 0),
            "won": bool(gs.won),
            "lost": bool(gs.lost),
            "objective": gs.objective or "",
            "admissible": sorted(set(gs.admissible_commands or [])),
            "policy": list(gs.policy_commands or []),
            "walkthrough": list(gs.get("extra.walkthrough") or []),
        }

    def _reset_engine(self, task: TaskSpec) -> Observation:
        """A game's first reset runs TextWorld's (0.05-0.6 s: it rebuilds the quest trees); later resets
        restore the initial state natively (ms), which also makes replay-restores cheaper."""
        self._load(task)
        if self._initial is not None:
            self._apply(self._initial)
        else:
            gs = self._env.reset()
            self._remember(gs, _clean(gs.feedback, gs.objective or ""))
            self._initial = self._capture() if self.native_snapshots else None
        return self._observation(self._last["text"])

    def _observation(self, text: str) -> Observation:
        last = self._last
        return Observation(
            text=text, objective=last["objective"], score=last["score"], info={"max_score": last["max_score"]}
        )

    def _step_engine(self, action: str) -> StepResult:
        last = self._last
        if last["won"] or last["lost"]:  # Frotz would ask to RESTART/UNDO; keep the ended state instead
            last["text"] = GAME_OVER
            return StepResult(
                GAME_OVER, 0.0, last["score"], True, last["won"], last["lost"], {"max_score": last["max_score"]}
            )
        gs, _, _ = self._env.step(" ".join(action.split()))  # one command: a newline would send two
        self._remember(gs, _clean(gs.feedback))
        new = self._last
        return StepResult(
            new["text"],
            new["score"] - last["score"],
            new["score"],
            new["won"] or new["lost"],
            new["won"],
            new["lost"],
            {"max_score": new["max_score"]},
        )

    def admissible_actions(self) -> list[str]:
        return list(self._last.get("admissible", []))

    def max_score(self) -> float | None:
        return float(self._last["max_score"]) if self._last and self._last.get("max_score") else None

    def expert_actions(self) -> list[str]:
        """TextWorld's plan from the current state; `--drop` games have none (their quests lack
        triggering policies), so there the rest of the walkthrough is used while we are still on it."""
        last = self._last
        if not last or last["policy"] or last["won"] or last["lost"]:
            return list(last.get("policy", []))
        walk, done = last["walkthrough"], self._actions
        return walk[len(done) :] if walk[: len(done)] == done else []

    # --- snapshots ------------------------------------------------------------------------
    def _layers(self) -> list[Any]:
        """The wrapper chain TWInform7 -> StateTracking -> Inform7Data -> GameData -> JerichoEnv."""
        from textworld.core import Wrapper

        layers = [self._env]
        while isinstance(layers[-1], Wrapper):
            layers.append(layers[-1]._wrapped_env)
        return layers

    def _capture(self) -> NativeState:
        layers = tuple(
            {k: _clone(v) for k, v in vars(layer).items() if k not in ("_wrapped_env", "_jericho")}
            for layer in self._layers()
        )
        return NativeState(self._env.unwrapped._jericho.get_state(), layers, _clone(self._last))

    def _apply(self, state: NativeState) -> None:
        for layer, saved in zip(self._layers(), state.layers, strict=True):
            for key, value in saved.items():
                setattr(layer, key, _clone(value))  # copy again: the snapshot stays restorable many times
        jericho = self._env.unwrapped._jericho
        jericho.set_state(state.frotz)
        self._last = {k: _clone(v) for k, v in state.last.items()}
        if not np.array_equal(jericho.get_state()[0], state.frotz[0]):
            raise RestoreError("the z-machine did not take the restored memory")

    def checkpoint(self) -> Snapshot:
        snap = super().checkpoint()
        if not self.native_snapshots:
            return snap
        try:
            return replace(snap, kind="native", payload=self._capture())
        except Exception:  # a backend without Jericho state: replay still works
            self.native_failures += 1
            return snap

    def restore(self, snapshot: Snapshot) -> Observation:
        if snapshot.kind == "native" and isinstance(snapshot.payload, NativeState):
            try:
                if self._task != snapshot.task or self._env is None:
                    self._reset_engine(snapshot.task)
                self._apply(snapshot.payload)
                if (self._last["score"], self._last["text"]) != (snapshot.score, snapshot.observation):
                    raise RestoreError("native restore does not match the recorded score/observation")
                self._task, self._actions = snapshot.task, list(snapshot.actions)
                self._last_observation, self._score = snapshot.observation, snapshot.score
                return self._observation(snapshot.observation)
            except Exception:
                self.native_failures += 1  # distrust the native state; replay verifies or raises RestoreError
                self.close()
        return super().restore(snapshot)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._path, self._initial = None, None, None
