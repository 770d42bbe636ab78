"""`oracle-agent`: hindsight valued by continuations of the agent being controlled, with a recovery's
lesson kept. Its values are exactly this agent's future (a scripted agent is deterministic), probing
leaves the episode untouched, and the room it measures is what it adds over the heuristic."""

from __future__ import annotations

import pytest

from rir_runtime.budgets import Budgets
from rir_runtime.controllers import AgentOracleController, HeuristicController, make_controller
from rir_runtime.decisions import Decision, Review
from rir_runtime.envs import TaskSpec
from rir_runtime.envs.builtin import WorkshopEnv
from rir_runtime.errors import RIRError, UserInputError
from rir_runtime.guidance import Guidance
from rir_runtime.loop import EpisodeRunner
from rir_runtime.memory import ReflectionMemory
from rir_runtime.policies import NoisyExpertPolicy
from rir_runtime.prompts import DecisionContext
from rir_runtime.recovery import PRESETS
from rir_runtime.trace import ReviewEvent
from rir_runtime.values import AgentProbe, Start

TASKS = [TaskSpec("builtin", task, "dev", v) for task in ("workshop-3", "workshop-4") for v in range(25)]
ONE_ROLLBACK = Budgets(agent=40, rollback=1)


def run(task: TaskSpec, controller, method: str = "rir", budgets: Budgets = ONE_ROLLBACK, error_rate: float = 0.2):
    env = WorkshopEnv()
    runner = EpisodeRunner(env, NoisyExpertPolicy(env, error_rate), controller, PRESETS[method], budgets, 8)
    return runner.run(task)


def test_the_value_of_going_on_from_the_start_is_the_agents_own_outcome() -> None:
    """K = 1 continuation of the scripted agent, from reset with an empty memory, is the react episode."""
    env = WorkshopEnv()
    for task in TASKS:
        react = run(task, HeuristicController(), method="react")
        obs = env.reset(task)
        probe = AgentProbe(env, NoisyExpertPolicy(env, 0.2).fork, Guidance())
        here = Start(env.checkpoint(), (), ReflectionMemory(obs.objective), obs.text, current=True)
        restored = Start(here.snapshot, (), here.memory, obs.text)  # the same start, reached by a restore
        assert probe.values(task.key, obs.objective, {None: here}, 40) == {None: float(react.success)}, task.key
        fresh = AgentProbe(env, NoisyExpertPolicy(env, 0.2).fork, Guidance())  # its own cache
        assert fresh.values(task.key, obs.objective, {0: restored}, 40) == {0: float(react.success)}, task.key


def test_with_one_rollback_its_values_come_true() -> None:
    """After its only recovery nothing intervenes, so a recovery valued 100% must win, one valued 0% must
    lose, and an episode it never recovers in ends as its last "continue" said."""
    recovered = 0
    for task in TASKS:
        record = run(task, AgentOracleController())
        reviews = [e for e in record.events if isinstance(e, ReviewEvent) and e.trigger != "terminal"]
        recoveries = [e for e in reviews if e.decision == "recover"]
        if recoveries:
            recovered += 1
            assert record.success == ("succeeds 100%" in recoveries[0].reason), (task.key, recoveries[0].reason)
        elif reviews and record.rollbacks == 0 and record.recoveries == 0:
            assert record.success == ("(100%)" in reviews[-1].reason), (task.key, reviews[-1].reason)
    assert recovered >= 3  # the grid has mistakes worth recovering from


def test_it_never_does_worse_than_the_heuristic_with_one_rollback_and_the_room_is_real() -> None:
    oracle = [run(task, make_controller("oracle-agent")).success for task in TASKS]
    heuristic = [run(task, HeuristicController()).success for task in TASKS]
    assert not any(h and not o for o, h in zip(oracle, heuristic, strict=True))
    assert sum(oracle) > sum(heuristic)


def test_fresh_draws_value_options_by_other_continuations_than_the_agents_own_future() -> None:
    """`oracle-agent:<K>` plays continuations 1..K (the agent's noise drawn afresh), never continuation
    0 (the very mistakes it will make); with K draws a value is a share of K; it keeps no edge that
    lies only in the agent's luck: where the two bounds disagree, the own-future one wins more."""
    forks: list[int] = []

    class Spy(NoisyExpertPolicy):
        def fork(self, env, k: int) -> NoisyExpertPolicy:
            forks.append(k)
            return super().fork(env, k)

    env = WorkshopEnv()
    obs = env.reset(TASKS[0])
    here = Start(env.checkpoint(), (), ReflectionMemory(obs.objective), obs.text, current=True)
    value = AgentProbe(env, Spy(env, 0.5).fork, Guidance(), rollouts=4, first=1).values(
        "t", obs.objective, {None: here}, 40
    )
    assert forks == [1, 2, 3, 4] and value[None] in (0.0, 0.25, 0.5, 0.75, 1.0)

    expected = make_controller("when=heuristic;where=oracle-agent:2;what=heuristic")
    assert expected.name == "when=heuristic,where=oracle-agent:2,what=heuristic" and expected.hindsight_draws == 2
    own = [run(task, make_controller("oracle-agent")).success for task in TASKS]
    fresh = [run(task, make_controller("oracle-agent:2")).success for task in TASKS]
    assert own != fresh and sum(own) >= sum(fresh)
    with pytest.raises(UserInputError, match="oracle-agent:x.*whole number >= 1"):
        make_controller("oracle-agent:x")


def test_probing_leaves_the_episode_as_it_was() -> None:
    """An oracle-agent whose reviews all say "continue" plays exactly the react episode up to its end,
    however much it probed on the way (the terminal recovery after a failed ending comes after)."""

    class Watcher(AgentOracleController):
        def review(self, ctx: DecisionContext) -> Decision:
            super().review(ctx)  # probe every option, then let the branch go on
            return Decision("review", Review("continue", "watching"))

    probed = 0
    for task in TASKS[:12]:
        watched = run(task, Watcher())
        react = run(task, HeuristicController(), method="react")
        first_restore = next((i for i, e in enumerate(watched.events) if e.type in ("reflect", "restore")), None)
        before = [e.action for e in watched.events[:first_restore] if e.type == "step"]
        assert before == [e.action for e in react.events if e.type == "step"], task.key
        probed += watched.oracle_env_steps
    assert probed > 0


def test_outside_a_loop_it_says_what_it_needs() -> None:
    ctx = DecisionContext("t", "goal", "", (), "", 0.0, "schedule", (0,))
    with pytest.raises(RIRError, match="inside an EpisodeRunner"):
        AgentOracleController().review(ctx)


def test_eval_reports_the_room_per_cell_with_its_paired_test(tmp_path) -> None:
    from eval.harness import EvalConfig, evaluate

    cfg = EvalConfig(
        env="builtin", tasks=["workshop-3", "workshop-4"], variations="0-9", methods=["react", "rir"],
        controller=["heuristic", "oracle", "oracle-agent", "when=heuristic;where=oracle-agent;what=heuristic",
                    "when=heuristic;where=oracle-agent:2;what=heuristic", "oracle-agent:2"],
        budget_agent="40", budget_rollback=1,
        review_interval=8, error_rate=0.2, out=str(tmp_path),
    )  # fmt: skip
    summary = evaluate(cfg)
    rooms = {row["scope"]: row for row in summary["room"]}
    assert set(rooms) == {"all", "workshop-3", "workshop-4"}
    for scope, row in rooms.items():
        assert row["episodes"] == (20 if scope == "all" else 10)
        assert row["diff"] == pytest.approx(row["oracle_agent"] - row["heuristic"], abs=1e-3)
        assert row["react"] is not None and row["oracle_expert"] is not None
    assert rooms["all"]["a_only"] == rooms["workshop-3"]["a_only"] + rooms["workshop-4"]["a_only"]
    where_only = summary["methods"]["rir/when=heuristic,where=oracle-agent,what=heuristic"]["success_rate"]
    assert rooms["all"]["oracle_agent_where"] == pytest.approx(where_only, abs=1e-3)
    fresh = summary["methods"]["rir/when=heuristic,where=oracle-agent:2,what=heuristic"]["success_rate"]
    assert rooms["all"]["oracle_agent_where_fresh"] == pytest.approx(fresh, abs=1e-3)
    whole_fresh = summary["methods"]["rir/oracle-agent:2"]["success_rate"]
    assert rooms["all"]["oracle_agent_fresh"] == pytest.approx(whole_fresh, abs=1e-3)
    report = (tmp_path / "report.md").read_text()
    assert (
        "## Room for a better controller" in report
        and "heuristic When, oracle-agent Where | the same, fresh draws | oracle-agent, fresh draws |" in report
    )
