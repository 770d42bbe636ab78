"""Episode jobs: the selection flags shared by `rir run`, `rir rollout` and `rir eval`, expanded
into one job per (task, method, seed), run in parallel workers into an append-only JSONL file.

Resuming is by episode id: finished episodes in the file are skipped, nothing is rewritten. A
killed run loses at most the episodes in flight (a partial last line is cut before appending).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rir_runtime.budgets import AgentBudget, Budgets
from rir_runtime.controllers.spec import check_controller_name
from rir_runtime.envs import ENV_CLASSES, Env, TaskSpec, make_env, parse_variations, resolve_tasks
from rir_runtime.errors import EngineError, UnknownNameError, UserInputError
from rir_runtime.llm.shared import forget_prefixes, shared_backend
from rir_runtime.lockstep import Lockstep
from rir_runtime.orchestration.executors import EXECUTORS, check_executor, make_executor
from rir_runtime.orchestration.output_lock import exclusive_output
from rir_runtime.policies import MODES
from rir_runtime.policy_spec import NOISY_EXPERT, PolicySpec, spellings
from rir_runtime.recovery import METHODS, PRESETS
from rir_runtime.trace import EpisodeRecord, append_record, drop_partial_tail, read_records
from rir_runtime.values import AUTO_WIDTH, LOOP_REPEATS

if TYPE_CHECKING:
    from rir_runtime.branching import Forced, Outcome
    from rir_runtime.loop import EpisodeRunner


@dataclass
class SelectionConfig:
    """What to run: environments x tasks x variations x methods x seeds, with one policy,
    one controller and fixed budgets. Shared by `rir run`, `rir rollout` and `rir eval`."""

    env: str = field(default="builtin", metadata={"help": "environment", "choices": list(ENV_CLASSES)})
    tasks: list[str] = field(default_factory=list, metadata={"help": "comma list of task names (default: all)"})
    split: str = field(default="dev", metadata={"help": "variation split", "choices": ["train", "dev", "test"]})
    variations: str = field(default="0-4", metadata={"help": "variation indices within the split: 0-9 or 0,3,5"})
    policy: str = field(default=NOISY_EXPERT, metadata={"help": " or ".join(spellings())})
    policy_mode: str = field(default="rank", metadata={"help": "LLM action mode", "choices": list(MODES)})
    error_rate: float = field(default=0.15, metadata={"help": "error rate of the noisy expert"})
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "comma list of presets"})
    controller: list[str] = field(
        default_factory=lambda: ["heuristic"],
        metadata={
            "help": "comma list of controllers: heuristic, oracle, prompted:<model>, tuned:<adapter>, "
            "or per-module swaps when=<c>;where=<c>;what=<c>"
        },
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "comma list of seeds"})
    budget_agent: str = field(
        default=str(Budgets.agent),
        metadata={"help": "B_agent: model calls per episode, or a multiple of the expert's path length (1.5x)"},
    )
    budget_rollback: int = field(default=Budgets.rollback, metadata={"help": "B_rb: recoveries per episode"})
    budget_controller: int | None = field(
        default=None,
        metadata={
            "help": "B_ctrl: the controller's model calls per episode, counted apart from B_agent (none: unbounded)"
        },
    )
    charge_controller: bool = field(
        default=False,
        metadata={
            "help": "charge the controller's model calls to B_agent (the agent's own model reviews itself; the "
            "accounting of figures before rir 0.2) instead of counting them apart"
        },
    )
    max_steps: int = field(default=Budgets.max_steps, metadata={"help": "environment steps per episode (safety cap)"})
    review_interval: int = field(default=4, metadata={"help": "initial scheduled review interval"})
    branch_width: int = field(
        default=AUTO_WIDTH,
        metadata={
            "help": "hindsight by the agent (oracle-agent): continuations of a decision played together, each on "
            "an engine of its own, their agent calls batched (1: one after another; 0: 8 on a GPU, 1 on a CPU)"
        },
    )
    loop_repeats: int = field(
        default=LOOP_REPEATS,
        metadata={
            "help": "hindsight by the agent: a continuation whose agent repeats one step (or a pair) this many "
            "times with nothing changing is called lost (0: play every continuation to its cap)"
        },
    )
    workers: int = field(default=1, metadata={"help": "parallel worker processes (with --executor ray: Ray actors)"})
    concurrency: int = field(
        default=1,
        metadata={
            "help": "episodes run concurrently in threads of one process (of each Ray actor); "
            "their model calls are batched into one generate call"
        },
    )
    executor: str = field(
        default="local",
        metadata={
            "help": "where episodes run: local processes/threads, or ray (a local Ray cluster started for the "
            'run, or --ray_address; needs pip install -e ".[ray]")',
            "choices": list(EXECUTORS),
        },
    )
    ray_address: str = field(
        default="", metadata={"help": "address of a running Ray cluster (auto, ray://host:10001); empty: start one"}
    )
    only: list[str] = field(
        default_factory=list,
        metadata={
            "help": "keep only these method[/controller] combinations of methods x controllers "
            "(e.g. react,rir/heuristic,rir/oracle); empty: all"
        },
    )
    out: str = field(default="runs/eval", metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        if self.env not in ENV_CLASSES:
            raise UnknownNameError("environment", self.env, list(ENV_CLASSES))
        for method in self.methods:
            if method not in PRESETS:
                raise UnknownNameError("method", method, list(PRESETS))
        if not self.methods:
            raise ValueError("methods is empty: name at least one of " + ", ".join(METHODS))
        policy = PolicySpec.parse(self.policy)
        if policy.is_llm:  # a model that cannot be had fails now, not after the episodes have started
            from rir_runtime.llm.factory import check_backend_spec

            check_backend_spec(policy.model)
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be within [0, 1]")
        self.budget_agent = str(AgentBudget.parse(self.budget_agent))
        Budgets(  # the budgets' own checks, before any episode runs
            AgentBudget.parse(self.budget_agent),
            self.budget_rollback,
            self.max_steps,
            controller=self.budget_controller,
            charge_controller=self.charge_controller,
        )
        if self.workers < 1 or self.concurrency < 1 or self.branch_width < 0:
            raise ValueError("workers and concurrency must be >= 1, branch_width >= 0 (0: chosen by the device)")
        if self.loop_repeats < 0:
            raise ValueError("loop_repeats must be >= 0 (0: never call a continuation looping)")
        if self.workers > 1 and self.concurrency > 1 and self.executor == "local":
            raise ValueError(
                f"workers={self.workers} and concurrency={self.concurrency} cannot be combined (concurrent episodes "
                "run as threads of one process): drop --workers to batch one model's calls across episodes "
                "(LLM policies and prompted or tuned controllers), or drop --concurrency to run episodes in "
                "separate processes (noisy-expert policy with heuristic or oracle controllers)"
            )
        check_executor(self.executor, self.ray_address)
        if not self.seeds:
            raise ValueError("seeds is empty: pass at least one seed, e.g. --seeds 0")
        if not self.controller:
            raise ValueError("controller is empty: name at least one, e.g. --controller heuristic")
        for spec in self.controller:
            check_controller_name(spec)
        parse_variations(self.variations)  # fail early on a malformed range
        offered = {m if not PRESETS[m].recovers else f"{m}/{c}" for m in self.methods for c in self.controller}
        missing = [k for k in self.only if k not in offered]
        if missing:
            raise ValueError(f"only names {missing}, which methods x controllers do not produce: {sorted(offered)}")


@dataclass(frozen=True)
class EpisodeJob:
    task: TaskSpec
    method: str
    controller: str
    policy: str
    policy_mode: str
    error_rate: float
    seed: int
    budget_agent: str  # as asked: "60" or "1.5x" (resolved per episode against the expert's path)
    budget_rollback: int
    max_steps: int
    review_interval: int
    tag: str = ""  # data_gen: exploratory variant name
    budget_controller: int | None = None  # B_ctrl; None: unbounded
    charge_controller: bool = False  # the controller's model calls count against B_agent
    branch_width: int = AUTO_WIDTH  # hindsight by the agent: continuations played together (0: by device)
    loop_repeats: int = LOOP_REPEATS  # hindsight by the agent: repeats that call a continuation looping

    def to_json(self) -> str:
        """The job as one JSON object: what a decision point needs to run its episode again."""
        data = asdict(self)
        data["task"] = [self.task.env, self.task.task, self.task.split, self.task.variation]
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> EpisodeJob:
        data = json.loads(text)
        env, task, split, variation = data.pop("task")
        return cls(TaskSpec(env, task, split, int(variation)), **data)

    @classmethod
    def of_record(cls, record: EpisodeRecord, run_config: dict[str, Any]) -> EpisodeJob:
        """The job that ran a recorded episode: the record's own settings, and from its run's config (a
        rollout's run.json) those a record does not keep (action mode, step cap, review interval)."""
        defaults = SelectionConfig()
        return cls(
            record.task_spec,
            record.method,
            record.controller if record.controller != "-" else "heuristic",
            record.policy,
            str(run_config.get("policy_mode", defaults.policy_mode)),
            record.error_rate,
            record.seed,
            record.budget_agent_spec,
            record.budget_rollback,
            int(run_config.get("max_steps", defaults.max_steps)),
            int(run_config.get("review_interval", defaults.review_interval)),
            record.tag,
            record.budget_controller,
            record.charge_controller,
        )

    @property
    def accounting(self) -> str:
        """How controller calls are paid for, as the episode id spells it: `c<B_ctrl>` (`c-`: unbounded)
        when counted apart, `charged` when B_agent pays for them (ids written before schema 3 have no
        such suffix; they were all charged)."""
        if self.charge_controller:
            return "charged"
        return f"c{self.budget_controller if self.budget_controller is not None else '-'}"

    @property
    def episode_id(self) -> str:
        ctrl = "-" if self.method == "react" else self.controller
        budget = f"b{self.budget_agent}r{self.budget_rollback}{self.accounting}"
        tag = f"/{self.tag}" if self.tag else ""
        return f"{self.task.key}/{self.method}/{ctrl}/{self.policy}/{budget}/s{self.seed}{tag}"


def expand_jobs(cfg: SelectionConfig, env: Env | None = None) -> list[EpisodeJob]:
    """All jobs of a selection, in a deterministic order; validates tasks and variations."""
    env = env or make_env(cfg.env)
    specs = resolve_tasks(env, cfg.tasks or None, cfg.split, parse_variations(cfg.variations))
    jobs: dict[str, EpisodeJob] = {}  # react has no controller: one job, whatever the controller list
    for spec in specs:
        for method in cfg.methods:
            for controller in cfg.controller:
                for seed in cfg.seeds:
                    job = EpisodeJob(
                        spec,
                        method,
                        controller,
                        cfg.policy,
                        cfg.policy_mode,
                        cfg.error_rate,
                        seed,
                        cfg.budget_agent,
                        cfg.budget_rollback,
                        cfg.max_steps,
                        cfg.review_interval,
                        budget_controller=cfg.budget_controller,
                        charge_controller=cfg.charge_controller,
                        branch_width=cfg.branch_width,
                        loop_repeats=cfg.loop_repeats,
                    )
                    if not cfg.only or job_key(job) in cfg.only:
                        jobs.setdefault(job.episode_id, job)
    return list(jobs.values())


def job_key(job: EpisodeJob) -> str:
    """`<method>` for methods that never recover (react), else `<method>/<controller>`: the keys of
    summary.json, which `only` selects by."""
    return job.method if not PRESETS[job.method].recovers else f"{job.method}/{job.controller}"


# --- running one job (inside a worker) --------------------------------------------------------------
_THREAD = threading.local()  # one environment per thread: engines are not thread-safe


def _forget_env(name: str) -> None:
    """Drop this thread's engine of `name` (closing what is left of it): the next episode starts a fresh one."""
    env = getattr(_THREAD, "envs", {}).pop(name, None)
    if env is not None:
        with contextlib.suppress(Exception):
            env.close()


def _env(name: str) -> Env:
    envs = getattr(_THREAD, "envs", None)
    if envs is None:
        envs = _THREAD.envs = {}
    if name not in envs:
        envs[name] = make_env(name)
    return envs[name]


R = TypeVar("R", bound="EpisodeRunner")


def runner_for(job: EpisodeJob, kind: type[R]) -> R:
    """The runner of a job's episode: its environment and model backends cached per worker process."""
    from rir_runtime.budgets import AgentBudget, Budgets
    from rir_runtime.controllers import make_controller
    from rir_runtime.policies import make_policy

    env = _env(job.task.env)
    policy = make_policy(PolicySpec.parse(job.policy), env, shared_backend, job.policy_mode, job.error_rate, job.seed)
    budgets = Budgets(
        AgentBudget.parse(job.budget_agent),
        job.budget_rollback,
        job.max_steps,
        controller=job.budget_controller,
        charge_controller=job.charge_controller,
    )
    controller = make_controller(job.controller, shared_backend)
    return kind(
        env,
        policy,
        controller,
        PRESETS[job.method],
        budgets,
        job.review_interval,
        branch_width=job.branch_width,
        loop_repeats=job.loop_repeats,
    )


ENGINE_RESTARTS = 2  # a dead engine is restarted and its episode rerun this many times, then the run stops


def run_job(job: EpisodeJob) -> EpisodeRecord:
    """Run one episode; where the engine's process dies under it, start a fresh engine and run the
    episode again from its start (an episode is a function of its job), at most ENGINE_RESTARTS times."""
    from rir_runtime.loop import EpisodeRunner

    restarts = 0
    while True:
        try:
            record = runner_for(job, EpisodeRunner).run(job.task)
            return record.with_job(episode_id=job.episode_id, seed=job.seed, tag=job.tag, error_rate=job.error_rate)
        except Exception as err:
            if not _env(job.task.env).engine_died(err):
                raise
            _forget_env(job.task.env)
            if restarts == ENGINE_RESTARTS:
                raise EngineError(
                    f"the {job.task.env} engine died {ENGINE_RESTARTS + 1} times running {job.episode_id} (an "
                    "infrastructure failure, not the agent's): run the same command again; the finished episodes "
                    "are kept and this one is retried"
                ) from None
            restarts += 1
            print(f"warning: the {job.task.env} engine died during {job.episode_id}; restarted it", file=sys.stderr)


def branch_job(job: EpisodeJob, at_review: int, decisions: Sequence[Forced]) -> list[Outcome]:
    """Each decision played out from the job's review `at_review`, all from one restored state
    (`rir_runtime.branching`)."""
    from rir_runtime.branching import BranchingRunner

    return runner_for(job, BranchingRunner).branches(job.task, at_review, decisions)


# --- the append-only episode file ------------------------------------------------------------------
def run_jobs(
    jobs: list[EpisodeJob],
    out_file: Path,
    workers: int = 1,
    concurrency: int = 1,
    on_record: Callable[[EpisodeRecord], None] | None = None,
    desc: str = "episodes",
    executor: str = "local",
    ray_address: str = "",
) -> list[EpisodeRecord]:
    """Run the jobs not yet in `out_file`, appending one line per finished episode (in the order they
    finish; with `executor="ray"` they run on Ray actors and stream back to this process). The folder is
    this process's while it runs: a second run into it is refused."""
    with exclusive_output(out_file.parent):
        return _run_jobs(jobs, out_file, workers, concurrency, on_record, desc, executor, ray_address)


def _run_jobs(
    jobs: list[EpisodeJob],
    out_file: Path,
    workers: int,
    concurrency: int,
    on_record: Callable[[EpisodeRecord], None] | None,
    desc: str,
    executor: str,
    ray_address: str,
) -> list[EpisodeRecord]:
    done_records = read_records(out_file)
    done = {r.episode_id for r in done_records}
    todo = [j for j in jobs if j.episode_id not in done]
    if len(todo) < len(jobs):
        print(f"resuming: {len(jobs) - len(todo)} of {len(jobs)} episodes already in {out_file}", file=sys.stderr)
    drop_partial_tail(out_file)
    new: list[EpisodeRecord] = []
    with out_file.open("ab", buffering=0) as fh, _progress(len(todo), desc) as bar:
        for record in _execute(todo, workers, concurrency, executor, ray_address):
            try:
                append_record(fh, record)
            except OSError as err:  # a full disk: say which file (a write names none)
                raise OSError(err.errno, err.strerror, str(out_file)) from err
            new.append(record)
            if on_record:
                on_record(record)
            bar.update(record)
    return done_records + new


def _execute(
    jobs: list[EpisodeJob], workers: int, concurrency: int = 1, executor: str = "local", ray_address: str = ""
) -> Iterator[EpisodeRecord]:
    """Records in completion order, from `workers` processes or Ray actors of `concurrency` threads."""
    runner = make_executor(executor, workers, concurrency, ray_address)
    yield from runner.map_unordered(partial(episode_worker, concurrency), jobs)


def episode_worker(concurrency: int) -> Callable[[EpisodeJob], EpisodeRecord]:
    """Runs once in each worker (process, Ray actor, or this process); environments and models stay
    cached there. With `concurrency` > 1 its episodes run in threads of one lockstep group, so their
    model calls go out in batches; one at a time, each starts with no kept prompt cache, so what it does
    depends on its own calls alone."""
    if concurrency <= 1:
        return _alone
    group = Lockstep()

    def run_in_group(job: EpisodeJob) -> EpisodeRecord:
        with group.member():
            return run_job(job)

    return run_in_group


def _alone(job: EpisodeJob) -> EpisodeRecord:
    forget_prefixes()
    return run_job(job)


class _progress:
    """A tqdm bar showing episodes done, success so far and episodes per minute."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="ep", file=sys.stderr, disable=total == 0, mininterval=2.0)
        self.start, self.n, self.wins = time.perf_counter(), 0, 0

    def update(self, record: EpisodeRecord) -> None:
        self.n += 1
        self.wins += record.success
        per_min = 60 * self.n / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix(success=f"{self.wins / self.n:.0%}", ep_per_min=f"{per_min:.1f}", refresh=False)
        self.bar.update(1)

    def __enter__(self) -> _progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def check_nonempty(jobs: list[EpisodeJob]) -> None:
    if not jobs:
        raise UserInputError("the selection has no episodes: check --tasks, --variations and --methods")
