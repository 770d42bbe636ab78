"""shopdb: tool calls on an in-memory SQLite shop. The expert wins every task type from reset and from
mid-episode states; silent mistakes are undone by restore, external calls are not; `query` is
read-only by SQLite's authorizer; snapshots round-trip the database; the contract checker passes."""

from __future__ import annotations

import pytest

from rir_runtime.budgets import Budgets
from rir_runtime.controllers import HeuristicController
from rir_runtime.envs import TaskSpec, make_env
from rir_runtime.envs.base import ColumnChange, RowChange
from rir_runtime.envs.checker import check_env
from rir_runtime.envs.checkpoints import CheckpointStore, Step
from rir_runtime.envs.shopdb import ShopDBEnv
from rir_runtime.envs.shopdb.readonly import REFUSED
from rir_runtime.envs.shopdb.scenario import SPLIT_SEED_BASE, VARIATIONS_PER_SPLIT, scenario, seed
from rir_runtime.envs.shopdb.tools import kind_of
from rir_runtime.errors import RestoreError
from rir_runtime.loop import EpisodeRunner
from rir_runtime.policies import NoisyExpertPolicy
from rir_runtime.recovery import PRESETS

TASKS = ShopDBEnv.task_names()


@pytest.fixture
def shop() -> ShopDBEnv:
    return ShopDBEnv()


def spec(task: str, v: int = 0, split: str = "dev") -> TaskSpec:
    return TaskSpec("shopdb", task, split, v)  # type: ignore[arg-type]


def play(env: ShopDBEnv, actions: list[str], store: CheckpointStore | None = None) -> list[Step]:
    """Take `actions`, saving a checkpoint before each when a store is given (as the runtime does)."""
    steps: list[Step] = []
    history: tuple[Step, ...] = store.latest.history if store is not None and len(store) else ()
    for action in actions:
        result = env.step(action)
        step = Step(len(history), action, result.observation, result.score, result.won, result.lost)
        history += (step,)
        steps.append(step)
        if store is not None:
            store.record_step(step, result)
            store.save(env, history)
    return steps


def first_write(env: ShopDBEnv, verbs: tuple[str, ...]) -> int:
    """Index in the expert plan of the first step calling one of `verbs`."""
    return next(i for i, a in enumerate(env.expert_actions()) if a.split()[0] in verbs)


# --- the expert ----------------------------------------------------------------------------
def test_registered_and_every_task_type_has_thousands_of_variations() -> None:
    env = make_env("shopdb")
    assert isinstance(env, ShopDBEnv) and set(TASKS) == {
        "return-refund",
        "stock-transfer",
        "price-change",
        "merge-accounts",
    }
    assert all(env.num_variations(t, s) >= 1000 for t in TASKS for s in ("train", "dev", "test"))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_expert_plan_wins_from_reset(shop: ShopDBEnv, task: str, split: str) -> None:
    for v in range(4):
        shop.reset(spec(task, v, split))
        plan = shop.expert_actions()
        assert 8 <= len(plan) <= 25 and plan[-1] == "finish"
        for action in plan:
            actions = shop.admissible_actions()
            assert action in actions and len(actions) < 40
            result = shop.step(action)
        assert result.won and result.done and not result.lost and result.score == shop.max_score() == 100.0


@pytest.mark.parametrize("task", TASKS)
def test_the_expert_replans_from_mid_episode_states(shop: ShopDBEnv, task: str) -> None:
    """From every prefix of the gold plan, and after a harmless wrong read, the plan still wins."""
    shop.reset(spec(task, 5))
    gold = shop.expert_actions()
    for cut in range(0, len(gold), 3):
        shop.reset(spec(task, 5))
        play(shop, gold[:cut])
        wrong_reads = [a for a in shop.admissible_actions() if kind_of(a) == "read" and a not in gold]
        play(shop, wrong_reads[:1])
        assert play(shop, shop.expert_actions())[-1].won


def test_splits_use_disjoint_seeds_and_differ() -> None:
    ranges = {s: range(b, b + VARIATIONS_PER_SPLIT) for s, b in SPLIT_SEED_BASE.items()}
    assert not set(ranges["train"]) & set(ranges["dev"]) and not set(ranges["dev"]) & set(ranges["test"])
    assert not set(ranges["train"]) & set(ranges["test"])
    seeds = {s: {seed(spec("return-refund", v, s)) for v in range(VARIATIONS_PER_SPLIT)} for s in ranges}
    assert not seeds["train"] & seeds["dev"] and not seeds["dev"] & seeds["test"]
    objectives = {s: {scenario(spec("merge-accounts", v, s)).objective for v in range(5)} for s in ranges}
    assert not objectives["train"] & objectives["dev"] and not objectives["dev"] & objectives["test"]


# --- mistakes and recovery -----------------------------------------------------------------
def test_silent_wrong_write_is_undone_by_restore(shop: ShopDBEnv) -> None:
    """A refund by the wrong branch of the fee rule answers like the right one and dooms the branch;
    restoring the checkpoint before it brings the expert's plan back, and the plan wins."""
    shop.reset(spec("return-refund", 2))
    store = CheckpointStore()
    store.save(shop, ())
    i = first_write(shop, ("refund",))
    plan = shop.expert_actions()
    play(shop, plan[:i], store)
    right = plan[i]
    wrong = next(a for a in shop.scenario.wrong[right] if a.split()[1] == right.split()[1])  # same order
    assert wrong in shop.admissible_actions()
    result = play(shop, [wrong], store)[-1]
    assert result.observation.startswith("refund: ") and "refused" not in result.observation  # silent
    assert shop.expert_actions() == []  # no tool can take a refund back
    ending = play(shop, plan[i + 1 :], store)[-1]
    assert ending.lost and 0 < ending.score < 100  # the symptom shows only at finish
    _, obs = store.restore(shop, i)
    assert obs.text == store[i].observation and shop.expert_actions() == plan[i:]
    assert play(shop, shop.expert_actions(), store)[-1].won


def test_a_wrong_set_is_corrected_by_the_plan_without_restore(shop: ShopDBEnv) -> None:
    """`set` writes overwrite a field: the expert plans the correction from the database itself."""
    for v in range(20):
        shop.reset(spec("price-change", v))
        plan = shop.expert_actions()
        i = first_write(shop, ("set_line_price",))
        wrong = [a for a in shop.scenario.wrong[plan[i]] if a.startswith("set_line_price")]
        play(shop, plan[:i])
        if wrong and "refused" not in play(shop, wrong[:1])[-1].observation:
            fix = shop.expert_actions()
            assert fix and fix != plan[i:]  # a correction was planned
            assert play(shop, fix)[-1].won
            return
    pytest.fail("no price-change variation offered a wrong-branch repricing")


def test_loud_mistake_changes_nothing_and_still_counts(shop: ShopDBEnv) -> None:
    shop.reset(spec("stock-transfer", 1))
    plan = shop.expert_actions()
    i = first_write(shop, ("transfer",))
    play(shop, plan[:i])
    before, steps = shop.db_hash(), len(shop.checkpoint().actions)
    product, source, target, qty = plan[i].split()[1:]
    result = shop.step(f"transfer {product} {source} {target} {int(qty) + 1}")
    assert "refused" in result.observation and "CHECK constraint failed" in result.observation
    assert shop.db_hash() == before and len(shop.checkpoint().actions) == steps + 1
    assert shop.expert_actions() == plan[i:]


def test_a_write_reports_the_rows_it_changed(shop: ShopDBEnv) -> None:
    """The step info names each row a write changed (what the trace keeps and the viewer shows): a set
    column with its old and new value, an appended ledger row; a refused write and a read report none."""
    shop.reset(spec("return-refund", 2))
    plan = shop.expert_actions()
    i = first_write(shop, ("record_return",))
    play(shop, plan[:i])
    line, qty = plan[i].split()[1:]
    (change,) = shop.step(plan[i]).info["changes"]
    assert (change.table, change.key, change.op) == ("order_lines", f"line_id={line}", "update")
    (returned,) = change.columns
    assert returned.column == "returned_qty" and int(returned.after or "") - int(returned.before or "") == int(qty)
    j = first_write(shop, ("refund",))
    play(shop, shop.expert_actions()[:j])
    order, amount = shop.expert_actions()[0].split()[1:]
    (refund,) = shop.step(shop.expert_actions()[0]).info["changes"]
    cents = str(round(float(amount) * 100))
    row = (ColumnChange("order_id", None, order), ColumnChange("amount_cents", None, cents))
    assert refund == RowChange("refunds", "", "insert", row)
    assert shop.step(f"refund {order} 999999").info == {}  # refused: nothing changed
    assert shop.step(f"get_order {order}").info == {}


def test_restore_across_a_sent_email_is_refused(shop: ShopDBEnv) -> None:
    shop.reset(spec("merge-accounts", 3))
    store = CheckpointStore()
    store.save(shop, ())
    plan = shop.expert_actions()
    e = first_write(shop, ("send_email",))
    results = [shop.step(a) for a in plan[:e]]
    assert not any(r.info.get("irreversible_side_effect") for r in results)
    shop.reset(spec("merge-accounts", 3))
    steps = play(shop, plan[: e + 2], store)
    assert steps[e].action.startswith("send_email") and shop.outbox == (plan[e],)
    assert store.admissible() == [e + 1, e + 2]  # nothing before the email may be restored
    reason = store.reason_not_admissible(e)
    assert reason is not None and "irreversible side effect" in reason
    with pytest.raises(RestoreError, match="irreversible side effect"):
        store.restore(shop, 0)
    store.restore(shop, e + 1)
    assert shop.outbox == (plan[e],)  # the email stays sent


def test_wrong_external_call_dooms_the_branch(shop: ShopDBEnv) -> None:
    shop.reset(spec("return-refund", 4))
    plan = shop.expert_actions()
    e = first_write(shop, ("send_email",))
    play(shop, plan[:e])
    wrong = shop.scenario.wrong[plan[e]][0]
    result = shop.step(wrong)
    assert result.info == {"irreversible_side_effect": True} and shop.outbox == (wrong,)
    assert shop.expert_actions() == []
    ending = play(shop, plan[e:])[-1]  # the right email too, and the rest of the plan
    assert ending.lost and len(shop.outbox) == 2


# --- snapshots -------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_snapshot_restore_round_trips_the_database(shop: ShopDBEnv, task: str) -> None:
    shop.reset(spec(task, 7))
    plan = shop.expert_actions()
    play(shop, plan[: len(plan) // 2])
    snap, before, outbox = shop.checkpoint(), shop.db_hash(), shop.outbox
    play(shop, plan[len(plan) // 2 : -1])
    assert shop.db_hash() != before
    for _ in range(2):
        obs = shop.restore(snap)
        assert shop.db_hash() == before and shop.outbox == outbox
        assert (obs.text, obs.score) == (snap.observation, snap.score)
        assert play(shop, shop.expert_actions())[-1].won
    other = ShopDBEnv()  # a fresh engine restores it too (the snapshot carries the task)
    other.restore(snap)
    assert other.db_hash() == before


# --- tools -------------------------------------------------------------------------------------
WRITES = [
    "INSERT INTO refunds (order_id, amount_cents) VALUES (1, 100)",
    "UPDATE customers SET points = 0",
    "DELETE FROM orders",
    "DROP TABLE orders",
    "WITH x AS (SELECT 1) DELETE FROM customers",
    "SELECT 1; DELETE FROM customers",
    "/* a comment */ uPdAtE products SET price_cents = 1 -- another",
    "PRAGMA foreign_keys = OFF",
    "ATTACH DATABASE ':memory:' AS other",
]


@pytest.mark.parametrize("sql", WRITES)
def test_query_refuses_writes(shop: ShopDBEnv, sql: str) -> None:
    shop.reset(spec("price-change", 0))
    before = shop.db_hash()
    result = shop.step(f"query {sql}")
    assert result.observation == REFUSED and not result.done
    assert shop.db_hash() == before and shop.checkpoint().actions == (f"query {sql}",)
    assert shop._conn.execute("PRAGMA foreign_keys").fetchone() == (1,)


def test_query_reads_and_bad_input_answers_with_an_observation(shop: ShopDBEnv) -> None:
    shop.reset(spec("price-change", 0))
    assert shop.step("query SELECT COUNT(*) AS n FROM warehouses").observation.startswith("n\n")
    assert "(1 row)" in shop.step("query SELECT ';' AS semicolon").observation
    for bad, says in [
        ("query SELEC * FROM orders", "syntax error"),
        ("query SELECT * FROM nowhere", "no such table"),
        ("query SELECT 'unclosed", "query failed"),
        ("query SELECT 1; SELECT 2", "one SQL statement per call"),
        ("query WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r", "too long"),
        ("refund abc 10", "whole number"),
        ("refund 1 10.005", "at most 2 decimals"),
        ("refund 1", "takes 2 argument(s)"),
        ("refund 999999 1.00", "no order #999999"),
        ("send_email 1 hello", "unknown template"),
        ("adjust_points 1 0", "cannot be 0"),
        ("teleport home", "unknown tool"),
    ]:
        result = shop.step(bad)
        assert says in result.observation and not result.done, (bad, result.observation)
    assert shop.outbox == ()


def test_admissible_actions_are_bounded_and_offer_plausible_mistakes(shop: ShopDBEnv) -> None:
    for task in TASKS:
        for v in range(3):
            shop.reset(spec(task, v))
            for action in shop.expert_actions():
                actions = shop.admissible_actions()
                assert actions == sorted(actions) and len(actions) < 40 and action in actions
                assert set(shop.scenario.wrong.get(action, ())) <= set(actions)
                shop.step(action)
            assert shop.admissible_actions() == []


def test_finish_scores_the_share_of_required_changes(shop: ShopDBEnv) -> None:
    shop.reset(spec("stock-transfer", 2))
    plan = shop.expert_actions()
    nothing = shop.step("finish")
    assert nothing.lost and nothing.score == 0.0 and shop.step("look").observation == "The episode is over."
    shop.reset(spec("stock-transfer", 2))
    ending = play(shop, plan[:-2] + ["finish"])[-1]
    assert ending.lost and 50 < ending.score < 100


# --- the contract checker and the scripted agent ---------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_contract_checker_passes(task: str) -> None:
    failed = {r.name: r.message for r in check_env(ShopDBEnv(), spec(task, 1)) if not r.passed}
    assert failed == {}


def test_the_error_injected_expert_plays_and_recovers() -> None:
    env = ShopDBEnv()
    injected = recovered = won = 0
    for task in TASKS:
        for v in range(3):
            runner = EpisodeRunner(
                env, NoisyExpertPolicy(env, 0.3), HeuristicController(), PRESETS["rir"], Budgets(agent=80), 8
            )
            record = runner.run(spec(task, v))
            injected += sum(getattr(e, "injected_error", False) for e in record.events)
            recovered += record.recoveries
            won += record.success
    assert injected > 0 and recovered > 0 and won > 0
