"""The episode loop and the recovery operator on the built-in workshop."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from rir_runtime.agent import AgentAction, AgentContext
from rir_runtime.budgets import Budgets
from rir_runtime.controllers import (
    ControllerSpec,
    HeuristicController,
    OracleController,
    PromptedController,
    SignalGatedController,
    make_controller,
    reflection_for,
)
from rir_runtime.decisions import Decision, Failure, Reflection, Review, avoid_lesson
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UnknownNameError
from rir_runtime.loop import EpisodeRunner
from rir_runtime.memory import MemorySnapshot, ReflectionMemory, is_state_claim
from rir_runtime.orchestration.jobs import SelectionConfig, expand_jobs, run_jobs
from rir_runtime.policies import NoisyExpertPolicy
from rir_runtime.prompts import DecisionContext, fit_decision
from rir_runtime.recovery import PRESETS, ReviewSchedule, segments
from rir_runtime.trace import read_records
from tests.factories import FakeCompletion, Margin, ScriptedBackend

TASKS = [TaskSpec("builtin", "workshop-3", "dev", v) for v in range(40)]
DEFAULT_BUDGETS = Budgets()


def run(
    method: str, task: TaskSpec, controller=None, budgets: Budgets = DEFAULT_BUDGETS, error_rate: float = 0.15
) -> dict:
    env = WorkshopEnv()
    runner = EpisodeRunner(
        env, NoisyExpertPolicy(env, error_rate), controller or HeuristicController(), PRESETS[method], budgets
    )
    return runner.run(task)


def events(record: dict, kind: str) -> list[dict]:
    return [e for e in record.events if e.type == kind]


def fatal_step(task: TaskSpec, actions: list[str]) -> int | None:
    """Ground truth: the first step after which the workshop is silently ruined."""
    env = WorkshopEnv()
    env.reset(task)
    for i, action in enumerate(actions):
        env.step(action)
        if env.ruined_ingredients():
            return i
    return None


def silent_error_tasks(min_gap: int = 3) -> list[tuple[TaskSpec, int]]:
    """Tasks whose first fatal error is silent and lies >= min_gap steps before the symptom."""
    found = []
    for task in TASKS:
        steps = events(run("react", task), "step")
        err = fatal_step(task, [e.action for e in steps])
        if err is not None and steps[-1].lost and len(steps) - 1 - err >= min_gap:
            found.append((task, err))
    assert found, "the workshop should produce silent errors at error rate 0.15"
    return found


# --- presets: (k, M+) ---------------------------------------------------------------------------------
def test_react_never_recovers() -> None:
    for task in TASKS[:15]:
        r = run("react", task)
        assert r.rollbacks == r.recoveries == 0 and not events(r, "review") and not events(r, "restore")


class AlwaysRecover(HeuristicController):
    def review(self, ctx):
        from rir_runtime.decisions import Review

        return Decision("review", Review("recover", "test"))


def test_self_refine_stays_and_keeps_text() -> None:
    records = [run("self-refine", t, AlwaysRecover()) for t in TASKS[:15]]
    restores = [e for r in records for e in events(r, "restore")]
    assert restores and all(e.k == 0 for e in restores)
    assert all(r.rollbacks == 0 for r in records)
    assert any(r.memory.notes for r in records) and all(not r.memory.failures for r in records)


def test_reflexion_restarts_from_the_initial_state_with_text() -> None:
    records = [run("reflexion", t) for t in TASKS[:20]]
    restores = [e for r in records for e in events(r, "restore")]
    assert restores and all(e.to == 0 for e in restores)
    assert any(r.memory.notes for r in records) and all(not r.memory.failures for r in records)


def test_rollback_only_keeps_nothing_and_rir_keeps_structure() -> None:
    only = [run("rollback-only", t) for t in TASKS[:20]]
    assert any(r.rollbacks for r in only)
    assert all(r.memory == MemorySnapshot() for r in only)
    full = [run("rir", t) for t in TASKS[:20]]
    assert any(r.memory.failures for r in full) and all(not r.memory.notes for r in full)
    assert any(0 < e.to for r in full for e in events(r, "restore"))


def test_rollback_only_repeats_the_mistake_rir_does_not() -> None:
    cases = silent_error_tasks()[:6]
    rir_wins = 0
    for task, err in cases:
        only, full = run("rollback-only", task, OracleController()), run("rir", task, OracleController())
        assert not only.success and only.rollbacks == Budgets().rollback  # same mistake every time
        assert all(e.to == err for e in events(only, "restore"))
        assert events(full, "restore")[0].to == err
        rir_wins += full.success
    assert rir_wins >= len(cases) - 1  # new mistakes after a recovery may still sink an episode


# --- Where: a silent error several steps before the symptom --------------------------------------
@pytest.mark.parametrize("controller", [OracleController, HeuristicController])
def test_coarse_to_fine_finds_a_silent_error_before_the_symptom(controller) -> None:
    cases = silent_error_tasks(min_gap=3)[:6]
    for task, err in cases:
        restores = events(run("rir", task, controller()), "restore")
        assert any(e.to == err for e in restores), f"{task.key}: no restore landed on the error step {err}"
        if controller is OracleController:
            assert restores[0].to == err  # hindsight goes straight to the step before the error


def test_segments_cut_at_milestones_and_chunks() -> None:
    env = WorkshopEnv()
    r = run("react", TASKS[0], error_rate=0.0)
    assert r.success

    history = tuple(Step(e.t - 1, e.action, e.observation, e.score) for e in events(r, "step"))[:-1]
    segs = segments(history, len(history))
    assert segs[0][0] == 0 and segs[-1][1] == len(history) + 1
    assert all(a < b and b - a <= 6 for a, b in segs)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(segs))
    del env


# --- What: memory -------------------------------------------------------------------------------------
def test_memory_drops_current_state_claims_and_conditions_lessons() -> None:
    memory = ReflectionMemory(objective="cook")
    memory.add(
        Reflection(
            ("The fridge is open", "knives are in the drawer", "I am holding the knife"),
            ("found the recipe",),
            Failure("holding the onion", "slice onion", "ruined", "you have the onion in your hand"),
        )
    )
    assert memory.env_knowledge == ["knives are in the drawer"]
    assert memory.dropped_state_claims == 3
    assert memory.failures[0].condition == "holding the onion" and not is_state_claim(memory.failures[0].lesson)
    assert "The fridge is open" not in memory.render()
    keeper = ReflectionMemory(objective="cook", keep_state_claims=True)
    keeper.add(Reflection(("The fridge is open",)))
    assert keeper.env_knowledge == ["The fridge is open"]


def test_memory_render_is_bounded_and_keeps_newest() -> None:
    memory = ReflectionMemory()
    for i in range(50):
        memory.add(Reflection(failure=Failure(f"case {i}", f"act {i}", "bad", "do something else")))
    text = memory.render(max_chars=300)
    assert len(text) <= 300 and "act 49" in text and "act 0'" not in text


class StateClaimController(HeuristicController):
    def reflect(self, ctx):
        base = super().reflect(ctx).value
        return Decision(
            "reflect", Reflection(("the notebook is open", "notebooks hold recipes"), base.milestones, base.failure)
        )


def test_state_claims_do_not_survive_a_restore_in_rir() -> None:
    for task, _ in silent_error_tasks()[:2]:
        r = run("rir", task, StateClaimController())
        assert "the notebook is open" not in r.memory.env_knowledge
        assert "notebooks hold recipes" in r.memory.env_knowledge
        r = run("rir-keeps-state-claims", task, StateClaimController())
        assert "the notebook is open" in r.memory.env_knowledge


# --- When: the adaptive schedule ---------------------------------------------------------------------
def test_review_interval_shrinks_on_signals_and_grows_on_continue() -> None:
    s = ReviewSchedule(base=4, minimum=1, maximum=16)
    assert s.interval == 4 and not s.due(3) and s.due(4)
    s.on_verdict(4, recovered=False)
    assert s.interval == 8 and s.next_due == 12
    s.on_verdict(12, recovered=False)
    s.on_verdict(28, recovered=False)
    assert s.interval == 16  # bounded
    s.on_signal(30)
    assert s.interval == 8 and s.next_due == 38
    s.on_signal(31)
    s.on_signal(32)
    s.on_signal(33)
    assert s.interval == 1 and s.next_due == 34
    s.on_verdict(34, recovered=True)
    assert s.interval == 4
    with pytest.raises(ValueError):
        ReviewSchedule(base=0)


def steps_until_next_review(record) -> list[int]:
    """For each restore that moved the world back (k > 0), the steps taken before the next review
    (restores whose episode ended first are left out)."""
    gaps, counting = [], None
    for e in record.events:
        if e.type == "restore" and e.k > 0:
            counting = 0
        elif e.type == "step" and counting is not None:
            counting += 1
        elif e.type == "review" and counting is not None:
            gaps.append(counting)
            counting = None
    return gaps


def test_the_review_schedule_counts_from_the_restore_point() -> None:
    """After a restore to checkpoint r the schedule restarts at r: the next scheduled review comes
    at most one base interval later. (Counting from the abandoned step made it come k steps late.)"""
    interval = 4
    gaps = [g for task in TASKS for g in steps_until_next_review(run("rir", task, error_rate=0.3))]
    assert len(gaps) >= 10, "the workshop at error rate 0.3 should give restores followed by reviews"
    assert max(gaps) <= interval, f"steps from a restore to the next review: {sorted(gaps)}"


def test_failed_episode_is_reviewed_before_it_ends() -> None:
    for task, _ in silent_error_tasks()[:3]:
        r = run("rir", task)
        first_recover = next(e for e in events(r, "review") if e.decision == "recover")
        assert first_recover.trigger == "terminal"


class NeverRecover(HeuristicController):
    """A When that always answers "continue", recording the triggers it was asked at."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def review(self, ctx):
        from rir_runtime.decisions import Review

        self.asked.append(ctx.trigger)
        return Decision("review", Review("continue", "test"))


def test_a_failed_ending_recovers_without_asking_the_when() -> None:
    """Nothing is left to continue after a failed ending: the runtime recovers while budgets last,
    whatever the When would say, and spends no controller call on it. (A tuned When that answered
    "continue" there gave up episodes the heuristic went on to win.)"""
    tasks = [task for task, _ in silent_error_tasks()[:4]]
    when = NeverRecover()
    records = [run("rir", task, when, Budgets(agent=60, rollback=2)) for task in tasks]
    terminal = [e for r in records for e in events(r, "review") if e.trigger == "terminal"]
    assert terminal and all(e.decision == "recover" for e in terminal)
    assert "terminal" not in when.asked and "schedule" in when.asked
    assert sum(r.rollbacks for r in records) == len(terminal)  # only the failed endings recovered
    assert all(r.recoveries <= 2 for r in records)
    spent = [run("rir", task, NeverRecover(), Budgets(agent=60, rollback=0)) for task in tasks]
    assert not any(events(r, "review") and e.trigger == "terminal" for r in spent for e in events(r, "review"))


# --- budgets and bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(PRESETS))
@pytest.mark.parametrize("budgets", [Budgets(agent=5, rollback=1), Budgets(agent=30, rollback=2), Budgets(0, 0)])
def test_budgets_are_never_exceeded(method: str, budgets: Budgets) -> None:
    for task in TASKS[:8]:
        r = run(method, task, budgets=budgets, error_rate=0.3)
        assert r.agent_calls <= budgets.agent and r.recoveries <= budgets.rollback


def test_a_gated_controller_asks_its_model_only_when_the_branch_shows_a_failure_signal() -> None:
    replies = ['{"decision": "continue", "reason": "fine"}']
    quiet, noisy = ScriptedBackend(replies), ScriptedBackend(replies)
    gated = make_controller("gated:prompted:fake", lambda name: quiet)
    assert isinstance(gated, SignalGatedController) and gated.name == "gated:prompted:fake" and gated.uses_model
    task = TASKS[0]
    r = run("rir", task, gated, Budgets(agent=60, rollback=3), error_rate=0.0)  # a quiet branch: no signal
    reviews = events(r, "review")
    assert reviews and quiet.calls == 0 == r.controller_calls
    assert all(e.reason == "no failure signal: the model was not asked" for e in reviews)
    ungated = run("rir", task, PromptedController(noisy, "prompted:fake"), Budgets(agent=60, rollback=3), 0.0)
    assert noisy.calls == len(events(ungated, "review")) > 0  # without the gate every review is a model call
    asked = make_controller("gated:prompted:fake", lambda name: quiet)
    ctx = DecisionContext("t", "goal", "", (), "", 0.0, "agent", (0,))
    assert asked.review(ctx).raw == replies[0] and quiet.calls == 1  # the agent's own request always reaches it
    ControllerSpec.parse("gated:prompted:fake")  # a gate around a model-backed kind
    with pytest.raises(UnknownNameError):
        ControllerSpec.parse("gated:heuristic")  # the gate saves model calls: a rule has none to save
    with pytest.raises(UnknownNameError):
        make_controller("gated:heuristic")


def test_a_ranked_reviews_margin_is_kept_in_the_trace_and_a_rules_is_not() -> None:
    """The margin lets a threshold be refitted on the agent's own online reviews."""
    task = TASKS[0]
    ranked = run("rir", task, PromptedController(Margin(-3.0), "prompted:fake"), Budgets(agent=60, rollback=3), 0.0)
    scheduled = [e for e in events(ranked, "review") if e.trigger == "schedule"]
    assert scheduled and all(e.margin == -3.0 and not e.recover for e in scheduled)
    ruled = run("rir", task, HeuristicController(), Budgets(agent=60, rollback=3), 0.15)
    assert events(ruled, "review") and all(e.margin is None for e in events(ruled, "review"))


def test_a_residual_controller_leaves_signalled_reviews_to_the_rule_and_asks_its_model_on_quiet_ones() -> None:
    replies = ['{"decision": "recover", "reason": "a silent mistake"}']
    backend = ScriptedBackend(replies)
    residual = make_controller("residual:prompted:fake", lambda name: backend)
    assert isinstance(residual, SignalGatedController) and residual.name == "residual:prompted:fake"
    loop = (
        Step(0, "take leg", "You take the leg.", 1.0),
        *(Step(i, "examine cookbook", "You read the recipe.", 1.0) for i in range(1, 4)),
    )
    stuck = DecisionContext("t", "Cook.", "", loop, "You read the recipe.", 1.0, "schedule", tuple(range(4)))
    decided = residual.review(stuck)
    assert decided.value == Review("recover", decided.value.reason) and "stuck" in decided.value.reason
    assert backend.calls == 0 == decided.model_calls  # the loop is a signal: the heuristic's rule, free
    quiet = replace(stuck, history=loop[:2], observation="You read the recipe.")
    assert residual.review(quiet).raw == replies[0] and backend.calls == 1  # no signal: the model decides
    gated = make_controller("gated:prompted:fake", lambda name: ScriptedBackend(replies))
    assert gated.review(quiet).value.decision == "continue"  # the other gate: quiet branches go on unasked
    ControllerSpec.parse("residual:prompted:fake")
    with pytest.raises(UnknownNameError):
        ControllerSpec.parse("residual:heuristic")


def test_prompted_controller_retries_once_then_falls_back() -> None:
    backend = ScriptedBackend(["I think we should go on", "still not json"])
    ctrl = PromptedController(backend, "prompted:fake")
    task, _ = silent_error_tasks()[0]
    r = run("rir", task, ctrl, Budgets(agent=60, rollback=3))
    review = events(r, "review")[0]
    assert review.trigger == "schedule" and review.decision == "continue"  # the safe default
    assert r.parse_failures >= 2 and backend.calls == 2 * r.controller_decisions  # each decision: a try, a retry
    assert r.controller_calls == backend.calls > 0 and r.agent_calls == r.env_steps  # counted apart
    assert r.controller_prompt_tokens > 0 and r.controller_seconds > 0 and not r.charge_controller
    heuristic = run("rir", task, HeuristicController(), Budgets(agent=60, rollback=3))
    assert heuristic.controller_calls == 0 and heuristic.agent_calls == heuristic.env_steps
    ok = PromptedController(
        ScriptedBackend(
            [
                '{"decision": "recover", "reason": "lost"}',
                '{"segment": 0}',
                '{"step": 0}',
                '{"env_knowledge": [], "milestones": [], "failure": null}',
            ]
        ),
        "prompted:fake",
    )
    r = run("rir", task, ok, Budgets(agent=60, rollback=1))
    assert events(r, "restore")[0].to == 0 and r.parse_failures == 0


def test_controller_calls_are_counted_apart_unless_charged_and_never_exceed_their_budget() -> None:
    """B_agent bounds the agent's own calls; B_ctrl the controller's; charged, B_agent bounds both."""
    replies = ['{"decision": "continue", "reason": "fine"}']
    task, _ = silent_error_tasks()[0]
    apart = run("rir", task, PromptedController(ScriptedBackend(replies), "prompted:fake"), Budgets(agent=30))
    charged = run(
        "rir", task, PromptedController(ScriptedBackend(replies), "prompted:fake"), Budgets(30, charge_controller=True)
    )
    assert apart.controller_calls > 0 and apart.agent_calls == apart.env_steps and not apart.charge_controller
    assert charged.charge_controller and charged.agent_calls + charged.controller_calls <= 30
    assert charged.agent_calls < apart.agent_calls  # the reviews' calls were the agent's steps
    bounded = run("rir", task, PromptedController(ScriptedBackend(replies), "prompted:fake"), Budgets(30, controller=2))
    assert bounded.controller_calls == 2 and bounded.budget_controller == 2
    reviews = events(bounded, "review")
    assert len(reviews) == 2  # further scheduled reviews had no call left: the branch goes on unreviewed
    with pytest.raises(ValueError, match="charge_controller"):
        Budgets(30, controller=2, charge_controller=True)


class RollbackCaller:
    name = "rollback-caller"

    def __init__(self, target: int | None) -> None:
        self.target, self.turn = target, 0

    def act(self, ctx: AgentContext) -> AgentAction:
        self.turn += 1
        if self.turn == 3:
            return AgentAction("rollback", "rollback", reason="test", target=self.target)
        return AgentAction("task", ctx.actions[0])


def test_rollback_tool_to_a_bad_checkpoint_is_a_tool_error_not_a_crash() -> None:
    env = WorkshopEnv()
    for method in ("rir", "react"):
        r = EpisodeRunner(env, RollbackCaller(99), HeuristicController(), PRESETS[method], Budgets(agent=6)).run(
            TASKS[0]
        )
        errors = events(r, "tool_error")
        assert len(errors) == 1 and ("does not exist" in errors[0].message or "not available" in errors[0].message)


def test_agent_rollback_call_starts_a_review() -> None:
    env = WorkshopEnv()
    r = EpisodeRunner(env, RollbackCaller(1), AlwaysRecover(), PRESETS["rir"], Budgets(agent=6)).run(TASKS[0])
    assert events(r, "review")[0].trigger == "agent" and events(r, "restore")[0].to == 1


def test_only_admissible_checkpoints_are_restored() -> None:
    class WildWhere(HeuristicController):
        def locate_fine(self, ctx):
            return Decision("locate_fine", 999)

    for task, _ in silent_error_tasks()[:2]:
        r = run("rir", task, WildWhere())
        assert events(r, "locate_fallback") and all(e.to < 999 for e in events(r, "restore"))


def test_a_reflection_that_could_not_be_parsed_is_logged_as_a_fallback() -> None:
    class GarbledWhat(AlwaysRecover):
        def reflect(self, ctx):
            return Decision("reflect", Reflection(), "{not json", parse_failures=2, meta={"fallback": True})

    reflects = events(run("rir", TASKS[0], GarbledWhat()), "reflect")
    assert reflects and all(e.fallback and not e.budget_spent for e in reflects)
    assert not any(e.fallback for e in events(run("rir", TASKS[0], AlwaysRecover()), "reflect"))

    class CostlyWhere(AlwaysRecover):  # a model-backed controller whose Where spends the whole budget
        uses_model = True

        def locate_fine(self, ctx):
            return Decision("locate_fine", max(ctx.admissible), model_calls=1000)

    for budgets in (Budgets(controller=5), Budgets(charge_controller=True)):  # B_ctrl, or B_agent when charged
        skipped = events(run("rir", TASKS[0], CostlyWhere(), budgets), "reflect")
        assert skipped and all(e.budget_spent and not e.fallback for e in skipped)
    unbounded = events(run("rir", TASKS[0], CostlyWhere()), "reflect")  # B_ctrl unbounded by default
    assert unbounded and not any(e.budget_spent for e in unbounded)


def test_eval_resumes_without_duplicates(tmp_path) -> None:
    cfg = SelectionConfig(
        env="builtin", tasks=["workshop-2"], variations="0-5", methods=["react", "rir"], out=str(tmp_path)
    )
    jobs = expand_jobs(cfg)
    out = tmp_path / "episodes.jsonl"
    run_jobs(jobs[:5], out)
    text = out.read_text()
    out.write_text(text + text.splitlines()[0][:40])  # a kill in the middle of a write
    with pytest.warns(UserWarning, match="partial last line"):
        records = run_jobs(jobs, out)
    ids = [r.episode_id for r in read_records(out)]
    assert len(records) == len(jobs) == len(set(ids)) == len(ids)
    assert json.loads(out.read_text().splitlines()[0])["episode_id"] == jobs[0].episode_id


def test_bad_selection_is_rejected() -> None:
    from rir_runtime.errors import UserInputError
    from rir_runtime.orchestration.config import build_config

    with pytest.raises(UserInputError, match="unknown method 'rirr'"):
        build_config(SelectionConfig, {"methods": ["rirr"]})
    with pytest.raises(UserInputError, match="agent budget '-1' is neither a count"):
        build_config(SelectionConfig, {"budget_agent": -1})
    with pytest.raises(UserInputError, match="budgets must be >= 0"):
        build_config(SelectionConfig, {"budget_rollback": -1})
    with pytest.raises(UserInputError, match="policy"):
        build_config(SelectionConfig, {"policy": "gpt"})
    assert build_config(SelectionConfig, {"budget_agent": 0}).budget_agent == "0"
    assert build_config(SelectionConfig, {"budget_agent": "1.50x"}).budget_agent == "1.5x"


class RankingBackend:
    """Scores continuations by a fixed preference: a narrow stand-in for a model's likelihoods."""

    supports_scoring = True

    def __init__(self, *prefer: str) -> None:
        self.prefer, self.scored = prefer, []

    def score(self, prompt, continuations):
        self.scored.append(continuations)
        return [1.0 if any(p in c for p in self.prefer) else 0.0 for c in continuations]

    def generate(self, prompts, **kwargs):
        return [FakeCompletion('{"env_knowledge": [], "milestones": [], "failure": null}') for _ in prompts]


def test_ranked_decisions_choose_within_the_closed_set() -> None:
    backend = RankingBackend('"recover"', '"segment": 1}')  # the middle segment holds several checkpoints
    ctrl = PromptedController(backend, "prompted:rank")
    task, err = silent_error_tasks()[0]
    r = run("rir", task, ctrl, Budgets(agent=60, rollback=1))
    assert events(r, "review")[0].decision == "recover" and r.parse_failures == 0
    assert ['{"decision": "continue"', '{"decision": "recover"'] in backend.scored
    fine = [c for c in backend.scored if c[0].startswith('{"step"')]
    assert fine and all(c.startswith('{"step": ') for c in fine[0])


def test_a_locate_with_one_candidate_spends_no_model_call() -> None:
    """B_agent pays for the controller's calls; a choice between one segment or checkpoint is no choice."""
    from rir_runtime.prompts import DecisionContext

    steps = tuple(Step(i, "examine cookbook", "You read the recipe.", 0.0) for i in range(4))
    ctx = DecisionContext("t", "Cook.", "", steps, "You read the recipe.", 0.0, admissible=tuple(range(5)))
    backend = RankingBackend("{")
    ctrl = PromptedController(backend, "prompted:rank")
    one = ctrl.locate_coarse(replace(ctx, segments=((0, 5),)))
    assert (one.value, one.model_calls, one.meta) == (0, 0, {"only_answer": True}) and backend.scored == []
    last = ctrl.locate_fine(replace(ctx, segment=(4, 5)))
    assert (last.value, last.model_calls) == (4, 0) and backend.scored == []
    two = ctrl.locate_coarse(replace(ctx, segments=((0, 3), (3, 5))))
    assert two.model_calls == 1 and len(backend.scored) == 1
    # without scoring the same holds: the one answer is not generated and parsed
    free_text = PromptedController(ScriptedBackend(["junk"]), "prompted:free")
    free = free_text.locate_coarse(replace(ctx, segments=((0, 5),)))
    assert (free.value, free.model_calls, free.parse_failures) == (0, 0, 0)


def test_heuristic_recovers_an_agent_stuck_in_a_loop_before_the_silent_mistake() -> None:
    from rir_runtime.prompts import DecisionContext

    steps = (
        Step(0, "take leg", "You take the leg.", 1.0),
        Step(1, "eat leg", "You eat the leg.", 1.0),
        *(Step(i, "examine cookbook", "You read the recipe.", 1.0) for i in range(2, 5)),
    )
    ctx = DecisionContext(
        task="t",
        objective="Cook.",
        memory="",
        history=steps,
        observation="You read the recipe.",
        score=1.0,
        trigger="schedule",
        admissible=tuple(range(5)),
    )
    review = HeuristicController().review(ctx).value
    assert review.decision == "recover" and "stuck" in review.reason
    assert HeuristicController().locate_fine(ctx).value == 1  # the checkpoint before eating the ingredient
    assert HeuristicController().review(replace(ctx, history=steps[:4])).value.decision == "continue"


def test_replies_map_to_listed_actions_only_for_typos_and_otherwise_go_as_typed() -> None:
    from rir_runtime.policies import match_action

    listed = ["close door to greenhouse", "move orange to kitchen", "take carrot from fridge"]
    assert match_action("Action: take carot from fridge", listed)[0].text == "take carrot from fridge"
    # unlisted but well-formed: sent as typed (stock ScienceWorld lists no "open" for an open door, yet accepts it)
    assert match_action("Action: open door to greenhouse", listed)[0].text == "open door to greenhouse"
    assert match_action("Action: open door to kitchen", listed)[0].text == "open door to kitchen"
    assert match_action("I think the best thing would be to look", listed) == (
        None,
        "'i think the best thing would be to look' is not a valid action",
    )
    assert match_action("", listed) == (None, "empty reply")


def test_failure_signals_say_which_are_urgent_between_scheduled_reviews() -> None:
    from rir_runtime.controllers import failure_signal
    from rir_runtime.prompts import DecisionContext

    def signal(*steps: Step):
        return failure_signal(
            DecisionContext(
                task="t",
                objective="o",
                memory="",
                history=steps,
                observation=steps[-1].observation,
                score=steps[-1].score,
            )
        )

    ok = Step(0, "take leg", "You take the leg.", 2.0)
    assert signal(ok) is None
    assert signal(ok, Step(1, "eat leg", "You eat the leg.", 1.0)).urgent  # score dropped
    assert signal(ok, Step(1, "focus on egg", "You focus on the egg.", -100.0, lost=True)).urgent
    error = signal(ok, Step(1, "go to moon", "No known action matches that input.", 2.0))
    assert error is not None and not error.urgent  # waits for the schedule
    stall = signal(*(Step(i, f"look {i}", "You see a room.", 0.0) for i in range(10)))
    assert stall is not None and stall.text == "no progress in 8 steps" and not stall.urgent


def test_reflection_parser_reads_copied_placeholders_as_empty_and_still_refuses_junk() -> None:
    from rir_runtime.decisions import parse
    from rir_runtime.errors import ParseError

    copied = (
        '{"env_knowledge": [<reusable facts>], "milestones": [ <progress reached> ], "failure": '
        '{"condition": "in the hallway", "action": "focus on baby elephant", "outcome": "lost", '
        '"lesson": "focus on the animal that lives longest"}} and some prose'
    )
    reflection = parse("reflect", copied)
    assert reflection.env_knowledge == () and reflection.milestones == ()
    assert reflection.failure == Failure(
        "in the hallway", "focus on baby elephant", "lost", "focus on the animal that lives longest"
    )
    assert parse("reflect", '{"env_knowledge": ["<a fact in brackets> is kept"], "failure": null}').env_knowledge == (
        "<a fact in brackets> is kept",
    )
    with pytest.raises(ParseError, match="malformed"):  # a broken structure is not repaired
        parse("reflect", '{"env_knowledge": [<reusable facts>], "failure": {"condition": "x"}, {"action": "y"}}')


class SlotBackend:
    """Answers each slot of a structured reflection from a script (cut at the stop string, as real
    backends do) and ranks by a preferred substring: a narrow stand-in for a model."""

    supports_scoring = True

    def __init__(self, slots: list[str], prefer: str) -> None:
        self.slots, self.prefer, self.prompts = slots, prefer, []

    def generate(self, prompts, max_new_tokens, stop=None, **kwargs):
        from rir_runtime.llm.backends import truncate_at_stop

        self.prompts.append(prompts[0])
        return [FakeCompletion(truncate_at_stop(self.slots.pop(0), stop))]

    def score(self, prompt, continuations):
        return [1.0 if self.prefer in c else 0.0 for c in continuations]


def test_structured_reflection_always_parses_and_blames_an_abandoned_step() -> None:
    import json

    from rir_runtime.decisions import parse
    from rir_runtime.prompts import DecisionContext
    from rir_runtime.structured import fill_reflection

    steps = (
        Step(0, "go to outside", "You move.", 25.0),
        Step(1, "focus on bee", "You focus on the bee.", 0.0),
        Step(2, "look around", "Nothing.", 0.0),
    )
    ctx = DecisionContext(
        task="t",
        objective="Focus on the animal that lives longest.",
        memory="",
        history=steps,
        observation="Nothing.",
        score=0.0,
        restore_point=1,
    )
    # a junk list, a list with a quote in an item, then a paraphrased condition (the ranking's context)
    backend = SlotBackend(
        [
            "<reusable facts>]",
            '"score 25 after \'go to outside\'", "a \\"quoted\\" one"] tail',
            'after 2: 50" trailing',
        ],
        prefer="bee",
    )
    decision = fill_reflection(backend, [{"role": "user", "content": "reflect"}], ctx)
    reflection = decision.value
    assert parse("reflect", decision.raw) == reflection  # the text kept parses back
    assert json.loads(decision.raw) == reflection.to_json()
    assert reflection.env_knowledge == () and reflection.milestones == (
        "score 25 after 'go to outside'",
        'a "quoted" one',
    )
    # the model chose the blamed action; the record around it is the trajectory's, not its paraphrase
    assert reflection.failure == Failure(
        "after seeing: You move.", "focus on bee", "the attempt failed later (Nothing.)", avoid_lesson("focus on bee")
    )
    assert reflection.failure == reflection_for(ctx, 1).failure  # the heuristic's record of the same step
    assert decision.model_calls == 1 and decision.meta["passes"] == 4 and decision.parse_failures == 0
    assert (
        backend.prompts[-1][-1]
        == {  # the last generated slot: the condition, after the kept lists
            "role": "assistant",
            "content": decision.raw[: decision.raw.index('"condition": "') + 14],
        }
    )
    # the step before the restore point is not abandoned, so it cannot be blamed; a later step's
    # record is conditioned on what was seen before it
    other = fill_reflection(SlotBackend(["]", "]", 'x"'], prefer="look"), [], ctx).value
    assert other.failure == Failure(
        "after seeing: You focus on the bee.",
        "look around",
        "the attempt failed later (Nothing.)",
        avoid_lesson("look around"),
    )


def test_after_a_stay_the_blamed_action_is_its_latest_repeat_as_the_heuristic_blames_a_loop() -> None:
    """A stay abandons nothing. Blaming a loop's first step would condition the record on "at the
    start", which memory guidance never sees again; its latest repeat is what the agent is about to do."""
    from rir_runtime.structured import fill_reflection

    book = "You open the cookbook."
    steps = tuple(Step(i, "examine cookbook", book, 0.0) for i in range(4))
    ctx = DecisionContext("t", "goal", "", steps, book, 0.0, admissible=tuple(range(5)), restore_point=4)
    ranked = fill_reflection(SlotBackend(["]", "]", 'x"'], prefer="cookbook"), [], ctx).value
    assert ranked.failure == reflection_for(ctx, 4).failure
    assert ranked.failure.condition == f"after seeing: {book}"
    reply = '{"env_knowledge": [], "milestones": [], "failure": {"condition": "c", "action": "examine cookbook"}}'
    free = PromptedController(ScriptedBackend([reply]), "prompted:fake").reflect(ctx).value
    assert free.failure == ranked.failure


def test_a_free_text_reflection_keeps_the_trajectorys_record_of_the_action_it_blames() -> None:
    """Without scoring (a remote server) the What is generated whole; its paraphrased condition
    would turn memory guidance off, so the record is rewritten around the blamed step."""
    import json

    steps = (Step(0, "go to outside", "You move.", 25.0), Step(1, "focus on bee", "You focus on the bee.", 0.0))
    ctx = DecisionContext("t", "goal", "", steps, "You focus on the bee.", 0.0, restore_point=1)

    def reply(action: str) -> str:
        failure = {"condition": "after 2: 50", "action": action, "outcome": "bad", "lesson": "hm"}
        return json.dumps({"env_knowledge": ["bees fly"], "milestones": [], "failure": failure})

    decision = PromptedController(ScriptedBackend([reply("focus on bee")]), "prompted:fake").reflect(ctx)
    assert decision.value.env_knowledge == ("bees fly",) and decision.raw == reply("focus on bee")
    assert decision.value.failure == reflection_for(ctx, 1).failure  # the heuristic's record of that step
    # an action the branch never took cannot be grounded: the model's record is kept as written
    kept = PromptedController(ScriptedBackend([reply("focus on ant")]), "prompted:fake").reflect(ctx).value
    assert kept.failure == Failure("after 2: 50", "focus on ant", "bad", "hm")


def test_an_ending_below_the_maximum_score_is_a_failure_the_terminal_review_sees() -> None:
    """A ScienceWorld episode can end 'completed' at score 83 after a wrong final action: not lost,
    no score drop. The heuristic must still see a failure, and a model-backed controller's prompt
    must say how the episode ended."""
    history = (Step(0, "go to outside", "You are outside.", 0.0), Step(1, "focus on bee", "You focus.", 83.0))
    ctx = DecisionContext("scienceworld/t", "goal", "", history, "You focus.", 83.0, "terminal", (0, 1), max_score=100)
    verdict = HeuristicController().review(ctx).value
    assert verdict.recover and "ended without success, at score 83 of 100" in verdict.reason
    prompt = fit_decision("review", ctx)[-1]["content"]
    assert "Outcome: the episode ended without success, at score 83 of 100" in prompt
    # reached the maximum, or not a terminal review: no signal from the score
    assert not HeuristicController().review(replace(ctx, max_score=83.0)).value.recover
    assert not HeuristicController().review(replace(ctx, trigger="schedule")).value.recover
    assert "Outcome:" not in fit_decision("review", replace(ctx, trigger="schedule"))[-1]["content"]


def test_the_loop_records_the_task_maximum_for_its_controllers() -> None:
    r = run("rir", TASKS[0])
    reset = r.events[0]
    assert reset.type == "reset" and reset.max_score == 100.0


def test_only_keeps_the_named_method_controller_combinations() -> None:
    from rir_runtime.errors import UserInputError
    from rir_runtime.orchestration.config import build_config

    base = {"env": "builtin", "tasks": ["workshop-3"], "variations": "0-1", "methods": ["react", "rir", "rir-unguided"]}
    cfg = build_config(
        SelectionConfig, {**base, "controller": ["heuristic", "oracle"], "only": ["react", "rir/oracle"]}
    )
    kept = {(j.method, j.controller if j.method != "react" else "-") for j in expand_jobs(cfg)}
    assert kept == {("react", "-"), ("rir", "oracle")}
    with pytest.raises(UserInputError, match="do not produce"):
        build_config(SelectionConfig, {**base, "only": ["rir/oracle"]})
