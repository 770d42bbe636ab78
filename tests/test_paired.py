"""Paired comparisons of methods on shared episodes: exact McNemar counts, summary.json and report.md."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import combinations
from math import comb

import pytest
from scipy.stats import binomtest

from eval.harness import EvalConfig, evaluate
from eval.paired import PairedComparison, combine, compare, find_comparison, mcnemar_exact, outcomes
from eval.report import table, write_report
from eval.summary import summarize
from rir_runtime.errors import UserInputError
from rir_runtime.trace import EpisodeRecord
from tests.factories import episode_record


def record(method: str, variation: int, success: bool, controller: str = "-", **key) -> EpisodeRecord:
    """A minimal episode record as `rir eval` writes it (the fields summary and report read)."""
    fields = dict(variation=variation, method=method, controller=controller, success=success)
    return episode_record(**fields, score=100.0 if success else 0.0, **key)


def runs(method: str, results: str, controller: str = "-", start: int = 0) -> list[EpisodeRecord]:
    """Records from a string of outcomes, one variation per character: '1' success, '0' failure."""
    return [record(method, start + i, c == "1", controller) for i, c in enumerate(results)]


def two_sided_tail(a_only: int, b_only: int) -> float:
    """Exact McNemar p by hand from binomial coefficients, to check the scipy-backed function against."""
    n, k = a_only + b_only, min(a_only, b_only)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


# --- the test itself ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("a_only", "b_only"), [(0, 6), (6, 0), (3, 3), (1, 9), (2, 5), (0, 0), (0, 1)])
def test_mcnemar_exact_is_the_two_sided_binomial_test_on_discordant_pairs(a_only: int, b_only: int) -> None:
    assert mcnemar_exact(a_only, b_only) == pytest.approx(two_sided_tail(a_only, b_only))


def test_mcnemar_known_values() -> None:
    assert mcnemar_exact(0, 6) == pytest.approx(2 * 0.5**6) == pytest.approx(0.03125)
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pair: no evidence either way
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_exact(-1, 2)


# --- pairing ----------------------------------------------------------------------------------------------------
def test_compare_counts_the_four_cells_on_shared_episodes_only() -> None:
    a = runs("rir", "1111110011", controller="heuristic")  # variations 0-9
    b = runs("react", "0000001011")[:8]  # variations 0-7 only
    b.append(record("react", 0, True, budget_rollback=3))  # another budget: not the same episode
    b.append(record("react", 0, True, seed=1))  # another seed: not the same episode
    c = compare("rir/heuristic", outcomes(a), "react", outcomes(b))
    # shared: variations 0-7 -> a 11111100, b 00000010
    assert (c.episodes, c.a_only, c.b_only, c.both, c.neither) == (8, 6, 1, 0, 1)
    assert c.unpaired == 2 + 2  # a's variations 8, 9 and b's two off-key episodes
    assert c.diff == pytest.approx((6 - 1) / 8)
    assert c.p_value == pytest.approx(binomtest(6, 7, 0.5).pvalue)
    assert c.significant == (c.p_value < 0.05)


def test_swapped_and_dict_round_trip_keep_the_counts() -> None:
    c = compare("a", outcomes(runs("a", "110100")), "b", outcomes(runs("b", "011000")))
    s = c.swapped()
    assert (s.a, s.b, s.a_only, s.b_only, s.both, s.neither) == ("b", "a", c.b_only, c.a_only, c.both, c.neither)
    assert s.diff == pytest.approx(-c.diff) and s.p_value == pytest.approx(c.p_value)
    assert PairedComparison.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_two_episodes_with_one_key_are_refused() -> None:
    with pytest.raises(UserInputError, match="two episodes"):
        outcomes(runs("react", "10") + runs("react", "1"), "react")


def test_combine_pools_disjoint_episode_sets() -> None:
    x = compare("a", outcomes(runs("a", "1110")), "b", outcomes(runs("b", "0011")))
    y = compare("a", outcomes(runs("a", "1111")), "b", outcomes(runs("b", "0000")))
    pooled = combine([x, y])
    assert pooled is not None
    assert (pooled.episodes, pooled.a_only, pooled.b_only) == (8, x.a_only + y.a_only, x.b_only + y.b_only)
    assert combine([]) is None
    with pytest.raises(ValueError, match="one pair"):
        combine([x, y.swapped()])


# --- summary.json ------------------------------------------------------------------------------------------------
def test_find_comparison_reads_a_summary_in_either_order() -> None:
    summary = summarize(runs("react", "000011") + runs("rir", "111111", "heuristic"), config={})
    forward = find_comparison(summary, "rir/heuristic", "react")
    backward = find_comparison(summary, "react", "rir/heuristic")
    assert forward is not None and backward is not None
    assert (forward.a_only, forward.b_only, forward.diff) == (4, 0, pytest.approx(4 / 6))
    assert backward == forward.swapped()
    assert find_comparison(summary, "rir/heuristic", "reflexion/heuristic") is None
    assert find_comparison({"methods": summary["methods"], "config": {}}, "rir/heuristic", "react") is None


def expected_pairs(episodes: list[dict]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(episodes, a_only, b_only) per sorted pair of method keys, counted straight from episodes.jsonl."""
    by_method: dict[str, dict[tuple, bool]] = defaultdict(dict)
    for r in episodes:
        name = r["method"] if r["controller"] == "-" else f"{r['method']}/{r['controller']}"
        by_method[name][(r["task"], r["variation"], r["seed"])] = bool(r["success"])
    counts = {}
    for a, b in combinations(sorted(by_method), 2):
        shared = by_method[a].keys() & by_method[b].keys()
        a_only = sum(by_method[a][k] and not by_method[b][k] for k in shared)
        b_only = sum(by_method[b][k] and not by_method[a][k] for k in shared)
        counts[(a, b)] = (len(shared), a_only, b_only)
    return counts


def test_eval_summary_has_one_paired_entry_per_pair_of_methods(tmp_path) -> None:
    cfg = EvalConfig(
        env="builtin",
        tasks=["workshop-3"],
        variations="0-9",
        seeds=[0, 1],
        methods=["react", "rir", "rollback-only"],
        error_rate=0.3,
        out=str(tmp_path),
    )
    evaluate(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert set(summary) >= {"methods", "config", "paired"}
    expected = expected_pairs(episodes)
    assert {(e["a"], e["b"]) for e in summary["paired"]} == set(expected)
    assert len(summary["paired"]) == len(expected) == 3
    for e in summary["paired"]:
        n, a_only, b_only = expected[(e["a"], e["b"])]
        assert (e["episodes"], e["a_only"], e["b_only"]) == (n, a_only, b_only), e
        assert e["episodes"] == summary["methods"][e["a"]]["episodes"] == 20  # every episode is paired
        assert e["diff"] == pytest.approx((a_only - b_only) / n, abs=1e-4)
        p = binomtest(a_only, a_only + b_only, 0.5).pvalue if a_only + b_only else 1.0
        assert e["p_value"] == pytest.approx(p)
        assert e["significant"] == (p < 0.05)


# --- report.md ---------------------------------------------------------------------------------------------------
def test_report_marks_a_significant_difference_and_lists_every_pair(tmp_path) -> None:
    records = (
        runs("react", "0000000011")
        + runs("rir", "1111111111", "heuristic")  # 8 vs 0 discordant against react: p = 2 / 2**8
        + runs("self-refine", "1110000011", "heuristic")  # 3 vs 0: p = 0.25
    )
    write_report(records, {"split": "dev"}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    assert "vs react" in rows["method"] and "95% CI" in rows["method"]
    assert "+80.0 pts" in rows["rir/heuristic"] and "*" in rows["rir/heuristic"], rows["rir/heuristic"]
    assert "+30.0 pts" in rows["self-refine/heuristic"] and "*" not in rows["self-refine/heuristic"]
    assert f"{2 / 2**8:.3g}*" in rows["rir/heuristic vs react"]
    assert "*" not in rows["self-refine/heuristic vs react"]
    pairs = [key for key in rows if " vs " in key][1:]  # after the header
    assert pairs[0] == "**rir/heuristic vs self-refine/heuristic** (headline)"  # RIR against the best other method
    assert len(pairs) == 3


def test_table_of_a_summary_without_paired_tests_has_no_comparison_column() -> None:
    summary = summarize(runs("react", "01") + runs("rir", "11", "heuristic"), config={})
    del summary["paired"]  # a summary.json written before paired tests existed
    assert "vs react" not in table(summary)
    assert table(summary).count("\n") == 3


def test_the_table_shows_the_controllers_calls_apart_from_the_agents() -> None:
    tuned = [
        record("rir", v, False, "tuned:x", controller_calls=c, controller_seconds=2.0 * c) for v, c in enumerate((2, 4))
    ]
    older = [record("rir", 0, False, "heuristic"), record("rir", 1, False, "heuristic", controller_calls=None)]
    summary = summarize(tuned + older, config={})
    assert summary["methods"]["rir/tuned:x"]["controller_calls"] == 3.0
    assert summary["methods"]["rir/tuned:x"]["controller_seconds"] == 6.0
    assert summary["methods"]["rir/heuristic"]["controller_calls"] is None  # one record predates the field
    rows = {line.split(" | ")[0][2:]: line for line in table(summary).splitlines()[2:]}
    assert "| 10.0 | 3.0 (6.0) |" in rows["rir/tuned:x"] and "| 10.0 | - |" in rows["rir/heuristic"]
