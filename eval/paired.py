"""Paired comparison of two methods' success on the same episodes (exact McNemar test).

Methods in one `rir eval` run meet the same (task, variation, seed) episodes, so their outcomes are
paired: whether two Wilson intervals overlap is the wrong test. Only the discordant pairs (one method
succeeded, the other failed) carry information about which is better; under "no difference" each
discordant pair goes either way with probability 1/2, which is the exact McNemar test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

from rir_runtime.errors import UserInputError
from rir_runtime.trace import EpisodeRecord

ALPHA = 0.05  # significance level of the `significant` flag (two-sided, not corrected for many pairs)

PairingKey = tuple[Any, ...]


def pairing_key(record: EpisodeRecord) -> PairingKey:
    """The episode two methods must share to be compared: same task instance, seed, budgets and
    accounting of controller calls (a charged controller leaves the agent fewer calls)."""
    return (
        record.env,
        record.task,
        record.split,
        record.variation,
        record.seed,
        record.budget_agent_spec,
        record.budget_rollback,
        record.budget_controller,
        record.charge_controller,
    )


def outcome(record: EpisodeRecord) -> bool:
    """Whether the episode succeeded."""
    return record.success


def outcomes(records: Iterable[EpisodeRecord], name: str = "") -> dict[PairingKey, bool]:
    """One method's outcomes by pairing key; two episodes with one key would make the pairing ambiguous."""
    by_key: dict[PairingKey, bool] = {}
    for r in records:
        key = pairing_key(r)
        if key in by_key:
            raise UserInputError(
                f"method {name or '?'} has two episodes for {key} (env, task, split, variation, seed, budgets): "
                "pair the records of one eval run, where each method runs each episode once"
            )
        by_key[key] = outcome(r)
    return by_key


# --- the test ------------------------------------------------------------------------------------------------
def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of a_only out of the discordant pairs at 1/2."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got a_only={a_only}, b_only={b_only}")
    if a_only + b_only == 0:
        return 1.0  # no discordant pair: no evidence either way
    from scipy.stats import binomtest  # scipy.stats takes most of a second to import: only when testing

    return float(binomtest(a_only, a_only + b_only, 0.5).pvalue)


@dataclass(frozen=True)
class PairedComparison:
    """Method `a` against method `b` on the episodes both ran; `diff` and `p_value` follow from the counts."""

    a: str
    b: str
    episodes: int  # paired episodes: both methods ran them
    a_only: int  # a succeeded, b failed
    b_only: int  # b succeeded, a failed
    both: int
    neither: int
    unpaired: int = 0  # episodes only one of the two ran, excluded from the test

    @property
    def diff(self) -> float:
        """Success rate of a minus that of b, on the paired episodes (0.0 when there are none)."""
        return (self.a_only - self.b_only) / self.episodes if self.episodes else 0.0

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.a_only, self.b_only)

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    def swapped(self) -> PairedComparison:
        """The same comparison read as b against a."""
        return PairedComparison(
            self.b, self.a, self.episodes, self.b_only, self.a_only, self.both, self.neither, self.unpaired
        )

    def to_dict(self) -> dict[str, Any]:
        """The `summary.json` entry: the counts plus the derived difference, p-value and flag."""
        return {**asdict(self), "diff": round(self.diff, 4), "p_value": self.p_value, "significant": self.significant}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> PairedComparison:
        """Read a `summary.json` entry back; the derived fields are recomputed from the counts."""
        return cls(
            a=entry["a"],
            b=entry["b"],
            episodes=int(entry["episodes"]),
            a_only=int(entry["a_only"]),
            b_only=int(entry["b_only"]),
            both=int(entry.get("both", 0)),
            neither=int(entry.get("neither", 0)),
            unpaired=int(entry.get("unpaired", 0)),
        )


def compare(
    a: str, a_outcomes: Mapping[PairingKey, bool], b: str, b_outcomes: Mapping[PairingKey, bool]
) -> PairedComparison:
    """Pair two methods' outcomes on the episodes both ran and count the four cells."""
    shared = a_outcomes.keys() & b_outcomes.keys()
    cells = [(a_outcomes[k], b_outcomes[k]) for k in shared]
    return PairedComparison(
        a=a,
        b=b,
        episodes=len(shared),
        a_only=sum(x and not y for x, y in cells),
        b_only=sum(y and not x for x, y in cells),
        both=sum(x and y for x, y in cells),
        neither=sum(not x and not y for x, y in cells),
        unpaired=len(a_outcomes.keys() ^ b_outcomes.keys()),
    )


def pairwise(groups: Mapping[str, Iterable[Any]]) -> list[PairedComparison]:
    """Every unordered pair of methods (names sorted, so a < b), given each method's records."""
    by_method = {name: outcomes(records, name) for name, records in groups.items()}
    return [compare(a, by_method[a], b, by_method[b]) for a, b in combinations(sorted(by_method), 2)]


# --- reading a summary back ----------------------------------------------------------------------------------
def find_comparison(summary: Mapping[str, Any], a: str, b: str) -> PairedComparison | None:
    """The paired comparison of `a` against `b` in a `summary.json` body, or None when it has none."""
    for entry in summary.get("paired", []):
        if (entry["a"], entry["b"]) == (a, b):
            return PairedComparison.from_dict(entry)
        if (entry["a"], entry["b"]) == (b, a):
            return PairedComparison.from_dict(entry).swapped()
    return None


def combine(comparisons: Iterable[PairedComparison]) -> PairedComparison | None:
    """Pool comparisons of the same two methods over disjoint episode sets (e.g. several benchmarks)."""
    items = list(comparisons)
    if not items:
        return None
    a, b = items[0].a, items[0].b
    if any((c.a, c.b) != (a, b) for c in items):
        raise ValueError(f"combine needs comparisons of one pair ({a} vs {b}); swap the others first")
    return PairedComparison(
        a,
        b,
        *(sum(getattr(c, f) for c in items) for f in ("episodes", "a_only", "b_only", "both", "neither", "unpaired")),
    )
