"""ScienceWorld adapter (`scienceworld` 1.2.3 on PyPI, a Scala simulator behind py4j; needs Java).

Restores by replay (`ReplayEnv`). Stock ScienceWorld does not replay reliably: objects keep their
contents in hash sets keyed by JVM identity hashes, so listing order, heat-transfer order and the
sequence of random draws change from one load to the next (object order in room descriptions,
a thermometer reading 26 vs 27 degrees, a partial score 29 vs 30 in Mendelian genetics). We start
the JVM with a constant identity hash (`-XX:hashCode=2`), which makes every load identical, and
keep `admissible_actions()` from consuming the simulator's global random stream (listing valid
actions picks random referents, which otherwise changes later outcomes of a replay that skips it).

Observations are ScienceWorld's own text with one change for agents: a room description is
compacted (`compact_look`) so the doors come first and the objects fit a prompt, and moving into
a room shows that room (a free look: no simulated time passes), as TextWorld does. Stock
ScienceWorld answers "You move to the outside." and lists the doors last, after a thousand
characters of kitchen, where a prompt clips them off.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from typing import Any

from rir_runtime.cache import cache_dir, write_atomic
from rir_runtime.envs.base import SPLITS, Observation, ReplayEnv, Split, StepResult, TaskSpec
from rir_runtime.errors import DependencyMissingError, UnknownNameError, UserInputError

JAVA_HINT = (
    "ScienceWorld needs a Java runtime (JRE 11+) on PATH: install one, e.g. `apt-get install openjdk-17-jre-headless`"
)
# constant identity hash -> deterministic set order; open java.util so the RNG state can be saved
DETERMINISM_OPTS = ["-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2", "--add-opens=java.base/java.util=ALL-UNNAMED"]
_JAVA_RANDOM_MULTIPLIER = 0x5DEECE66D  # java.util.Random.setSeed scrambles with this

# Task -> number of variations in scienceworld 1.2.3 (PythonInterface.getTaskMaxVariations), in
# the package's task order. Kept here so listing and validating tasks starts no JVM; reset()
# checks the count against the running engine.
MAX_VARIATIONS: dict[str, int] = {
    "boil": 30,
    "melt": 30,
    "freeze": 30,
    "change-the-state-of-matter-of": 30,
    "use-thermometer": 540,
    "measure-melting-point-known-substance": 436,
    "measure-melting-point-unknown-substance": 300,
    "power-component": 20,
    "power-component-renewable-vs-nonrenewable-energy": 20,
    "test-conductivity": 900,
    "test-conductivity-of-unknown-substances": 600,
    "find-living-thing": 300,
    "find-non-living-thing": 300,
    "find-plant": 300,
    "find-animal": 300,
    "grow-plant": 126,
    "grow-fruit": 126,
    "chemistry-mix": 32,
    "chemistry-mix-paint-secondary-color": 36,
    "chemistry-mix-paint-tertiary-color": 36,
    "lifespan-longest-lived": 125,
    "lifespan-shortest-lived": 125,
    "lifespan-longest-lived-then-shortest-lived": 125,
    "identify-life-stages-1": 14,
    "identify-life-stages-2": 10,
    "inclined-plane-determine-angle": 168,
    "inclined-plane-friction-named-surfaces": 1386,
    "inclined-plane-friction-unnamed-surfaces": 162,
    "mendelian-genetics-known-plant": 120,
    "mendelian-genetics-unknown-plant": 480,
}

_launch_lock = threading.Lock()
_ROOM_NAME = re.compile(r"^This (?:room|outside location) is called the ([^.]+)\.")
_DOOR = re.compile(r"^A door to the (.+?) \(that is (open|closed)\)$")
_CLOSE_DOOR, _OPEN_DOOR = "close door to ", "open door to "


def compact_look(text: str) -> str:
    """A room description with the doors first and one short entry per object:
    "This room is called the kitchen. Doors to: bathroom, hallway (closed). Here you see: a chair,
    a counter, ...". Text that is not a room description comes back unchanged. What lies on or in
    an object is cut with its first sentence ("a table. On the table is: a cup" -> "a table"):
    `look at table` shows it. Tasks that need such contents in view would want them kept."""
    name = _ROOM_NAME.match(text)
    if not name or "\n" not in text:
        return text
    objects, doors = [], []
    for line in text.split("\n")[1:]:
        line = line.strip()
        door = _DOOR.match(line)
        if door:
            doors.append(door.group(1) + (" (closed)" if door.group(2) == "closed" else ""))
        elif line and line != "You also see:" and line not in ("the agent", "a substance called air"):
            objects.append(line.split(". ")[0].rstrip("."))
    parts = [f"This room is called the {name.group(1)}."]
    if doors:
        parts.append("Doors to: " + ", ".join(doors) + ".")
    parts.append("Here you see: " + (", ".join(objects) or "nothing") + ".")
    return " ".join(parts)


def split_variations(n: int) -> dict[str, list[int]]:
    """The engine's train/dev/test variation ids for a task with `n` variations.

    Mirrors PythonInterface.getSets (quarters: train = first two, dev = third, test = the rest),
    so no task has to be loaded to count variations; the tests compare it with the engine.
    """
    small = {0: ([], [], []), 1: ([0], [], [0]), 2: ([0], [], [1]), 3: ([0], [1], [2])}
    if n in small:
        return dict(zip(SPLITS, map(list, small[n]), strict=True))
    q = n // 4
    g = [list(range(i, min(i + q, n))) for i in range(0, n, q)]
    return {"train": g[0] + g[1], "dev": g[2], "test": g[3] + (g[4] if len(g) > 4 else [])}


def gold_path_apart(task: str, variation_id: int, simplification: str) -> tuple[str, ...]:
    """The gold path of a variation, generated in a process (and engine) of its own. An engine's gold path
    depends on what it loaded before: test-conductivity train 88's runs through the workshop when it is the
    engine's first load and through the living room after 86's, whose path goes there. Generated in the
    episode's engine, each worker's expert (and so each episode) would depend on that worker's history."""
    script = (
        "import json, sys\n"
        "from rir_runtime.envs.scienceworld_env import ScienceWorldEnv\n"
        "sw = ScienceWorldEnv()._engine()\n"
        "sw.load(sys.argv[1], int(sys.argv[2]), sys.argv[3], generateGoldPath=True)\n"
        "print(json.dumps([str(a) for a in sw.server.getGoldActionSequence()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, task, str(variation_id), simplification],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise DependencyMissingError(f"generating the gold path of {task} {variation_id} failed: {done.stderr[-500:]}")
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def gold_path(task: str, variation_id: int, simplification: str) -> tuple[str, ...]:
    """The gold path of a variation, read from the cache (`<cache>/scienceworld/gold/<package version>/...`)
    or generated apart and stored there: generating it takes a fresh JVM (3-20 s), and every worker, label
    build and evaluation asks for the same few hundred paths. An unreadable entry is generated again."""
    version = f"scienceworld-{md.version('scienceworld')}"
    path = cache_dir("scienceworld", "gold", version, simplification, task, f"{variation_id}.json")
    try:
        actions = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions):
            return tuple(actions)
    except (OSError, ValueError):
        pass  # missing or corrupt: generate it
    actions = gold_path_apart(task, variation_id, simplification)
    write_atomic(path, json.dumps(list(actions)))
    return actions


class _FromPy4J(logging.Filter):
    """Drops the records py4j logs on the root logger (`logging.exception` when the JVM dies mid-call),
    which would print a traceback above the runtime's one-line warning that it restarted the engine."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


def _quiet_py4j_root_records() -> None:
    root = logging.getLogger()
    if not any(isinstance(f, _FromPy4J) for f in root.filters):
        root.addFilter(_FromPy4J())


@functools.lru_cache(maxsize=1)
def _java_accepts(opts: tuple[str, ...]) -> bool:
    """Whether this JVM accepts our determinism flags (`-XX:hashCode` is an experimental flag)."""
    try:
        return subprocess.run(["java", *opts, "-version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class ScienceWorldEnv(ReplayEnv):
    """One ScienceWorld JVM, started on first use and reused across tasks (only `load` per reset)."""

    name = "scienceworld"
    expert_replans = False  # gold paths only

    def __init__(self, step_limit: int = 250, simplification: str = "easy") -> None:
        super().__init__()
        self.step_limit = step_limit
        self.simplification = simplification
        self.deterministic = False  # set when the JVM runs with DETERMINISM_OPTS
        self._sw: Any = None  # scienceworld.ScienceWorldEnv, started lazily
        self._rng: tuple[Any, Any, Any, Any] | None = None  # (java Random, seed, gaussian flags)
        self._gold: dict[tuple[str, int, str], tuple[str, ...]] = {}
        self._variation_id = 0
        self._steps = 0
        self._prev_score = 0.0

    # --- catalogue ------------------------------------------------------------------------
    @classmethod
    def task_names(cls) -> list[str]:
        return list(MAX_VARIATIONS)

    def _split_ids(self, task: str, split: str) -> list[int]:
        if task not in MAX_VARIATIONS:
            raise UnknownNameError(f"{self.name} task", task, list(MAX_VARIATIONS))
        if split not in SPLITS:
            raise UnknownNameError("split", split, list(SPLITS))
        return split_variations(MAX_VARIATIONS[task])[split]

    def num_variations(self, task: str, split: Split) -> int:
        return len(self._split_ids(task, split))

    # --- engine ---------------------------------------------------------------------------
    def _engine(self) -> Any:
        """Start the JVM once (3-7 s); its stdout/stderr go to /dev/null (py4j's default)."""
        if self._sw is not None:
            return self._sw
        if shutil.which("java") is None:
            raise DependencyMissingError(JAVA_HINT)
        try:
            import scienceworld.scienceworld as sws
        except ImportError:
            raise DependencyMissingError("ScienceWorld is not installed: `pip install scienceworld==1.2.3`") from None
        opts = DETERMINISM_OPTS if _java_accepts(tuple(DETERMINISM_OPTS)) else []
        # a dead JVM is the runtime's to restart (`Env.engine_died`): py4j's own tracebacks would only bury that
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        _quiet_py4j_root_records()
        with _launch_lock:  # the package offers no javaopts argument: patch its launcher briefly
            original = sws.launch_gateway
            sws.launch_gateway = functools.partial(original, javaopts=opts)
            try:
                self._sw = sws.ScienceWorldEnv("", envStepLimit=10**9)
            finally:
                sws.launch_gateway = original
        self.deterministic = bool(opts)
        try:  # handles on the global scala.util.Random, to keep admissible_actions() side-effect free
            jvm = self._sw._gateway.jvm
            rnd = getattr(getattr(jvm.scala.util, "Random$"), "MODULE$").self()
            cls = jvm.java.lang.Class.forName("java.util.Random")
            fields = [cls.getDeclaredField(n) for n in ("seed", "haveNextNextGaussian", "nextNextGaussian")]
            for f in fields:
                f.setAccessible(True)
            self._rng = (rnd, *fields)
        except Exception:  # noqa: BLE001 - a JVM without --add-opens: listing may perturb replays
            self._rng, self.deterministic = None, False
        return self._sw

    def _reset_engine(self, task: TaskSpec) -> Observation:
        if task.env != self.name:
            raise UserInputError(f"task {task.key} is for environment '{task.env}', not '{self.name}'")
        ids = self._split_ids(task.task, task.split)
        if not 0 <= task.variation < len(ids):
            raise UserInputError(
                f"variation {task.variation} does not exist for {self.name} task '{task.task}' in split "
                f"'{task.split}' (it has variations 0-{len(ids) - 1}); pick one within that range"
            )
        sw = self._engine()
        if sw.get_max_variations(task.task) != MAX_VARIATIONS[task.task]:
            raise DependencyMissingError(
                f"the installed scienceworld has a different variation count for '{task.task}' than "
                f"this adapter expects: install scienceworld==1.2.3"
            )
        self._variation_id = ids[task.variation]
        sw.load(task.task, self._variation_id, self.simplification, generateGoldPath=False)
        self._steps, self._prev_score = 0, 0.0
        # a free look (no simulated time passes) so the gold path still applies from here
        text = compact_look(str(sw.server.freeActionLook()).rstrip())
        return Observation(
            text=text,
            objective=str(sw.server.getTaskDescription()),
            score=0.0,
            info={"variation_id": self._variation_id, "simplification": self.simplification},
        )

    def max_score(self) -> float | None:
        return 100.0  # the package's scores are 0..1, reported here as percent

    def _step_engine(self, action: str) -> StepResult:
        server = self._sw.server
        text = compact_look(str(server.step(action)).rstrip())
        if text.startswith("You move to the "):  # show the new room, as TextWorld does (free: no time passes)
            text = f"{text} {compact_look(str(server.freeActionLook()).rstrip())}"
        score = float(int(round(100 * server.getScore())))  # same conversion as the package
        completed = bool(server.getCompleted())
        self._steps += 1
        reward, self._prev_score = score - self._prev_score, score
        won, lost = score >= 100, score < 0  # a wrong focus scores -100 and ends the episode
        limit = self._steps >= self.step_limit
        return StepResult(
            observation=text,
            reward=reward,
            score=score,
            done=completed or won or lost or limit,
            won=won,
            lost=lost,
            info={
                "moves": int(server.getNumMoves()),
                "steps": self._steps,
                "completed": completed,
                "step_limit_reached": limit and not (won or lost),
            },
        )

    # --- actions --------------------------------------------------------------------------
    def admissible_actions(self) -> list[str]:
        """Sorted unique valid actions; the engine's random draws for referents are undone.

        ScienceWorld lists "close door to X" for an open door but not "open door to X", which it
        accepts ("The door is already open.") and which its own gold paths use at every door. We add
        it, so that the listing holds every gold action but the final "move ... in inventory to ..."
        of the find tasks (listed as "move ... to ...") and a policy that can only pick listed
        actions can walk the expert's way.
        """
        if self._task is None:
            raise RuntimeError("admissible_actions() called before reset()")
        server = self._sw.server
        saved = None
        if self._rng is not None:
            rnd, seed, have_g, next_g = self._rng
            saved = (seed.get(rnd), have_g.getBoolean(rnd), next_g.getDouble(rnd))
        data = json.loads(str(server.getValidActionObjectCombinationsJSON()))  # one call, not a py4j list
        if saved is not None:
            rnd.setSeed(saved[0] ^ _JAVA_RANDOM_MULTIPLIER)  # setSeed scrambles: this restores it exactly
            have_g.setBoolean(rnd, saved[1])
            next_g.setDouble(rnd, saved[2])
        listed = {str(a["action"]) for a in data.get("validActions", [])}
        reopen = {_OPEN_DOOR + a[len(_CLOSE_DOOR) :] for a in listed if a.startswith(_CLOSE_DOOR)}
        return sorted(listed | reopen)

    def gold_actions(self) -> list[str]:
        """The whole gold path of the current variation (generated once per variation and cached on disk)."""
        if self._task is None:
            raise RuntimeError("gold_actions() called before reset()")
        key = (self._task.task, self._variation_id, self.simplification)
        if key not in self._gold:
            self._gold[key] = gold_path(*key)
        return list(self._gold[key])

    def expert_actions(self) -> list[str]:
        """The rest of the gold path while the branch follows it; [] off it (no oracle there)."""
        if self._task is None:
            return []
        gold, done = self.gold_actions(), self._actions
        return gold[len(done) :] if gold[: len(done)] == done else []

    def engine_died(self, err: BaseException) -> bool:
        """py4j's network error anywhere in the chain, or any py4j error while the JVM no longer answers
        (a JVM that died between episodes fails the next call with a plain `Py4JError`)."""
        from py4j.protocol import Py4JError, Py4JNetworkError

        link: BaseException | None = err
        while link is not None:
            if isinstance(link, Py4JNetworkError):
                return True
            if isinstance(link, Py4JError):
                return not self._jvm_answers()
            link = link.__cause__ or link.__context__
        return False

    def _jvm_answers(self) -> bool:
        try:
            self._sw._gateway.jvm.System.currentTimeMillis()
            return True
        except Exception:  # noqa: BLE001 - whatever py4j raises, the JVM is gone
            return False

    def close(self) -> None:
        if self._sw is not None:
            try:
                self._sw.close()
            finally:
                self._sw, self._rng = None, None
