"""Paired comparisons of two methods trained on the same seeds: mean difference, 95% t interval, n to exclude 0.

Two rows of the result table share their reporting seeds, so seed s of row A and seed s of row B saw the same
data order and sampling stream: the per-seed differences remove the part of the seed noise both rows share, and
the interval is the one-sample Student t interval of those differences (n - 1 degrees of freedom). Seeds where
either row failed are left out of that pair (the n says how many remained).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

#: the confidence of every interval in the result table
CONFIDENCE = 0.95
#: the largest n ``seeds_to_exclude_zero`` looks at before it says "more than this"
MAX_SEEDS = 1000


def pooled_std(groups: Sequence[Sequence[float]]) -> float | None:
    """The seed-to-seed spread of one init, pooled over inits (each group: one init's values on several seeds);
    None without a group of two or more."""
    dof = sum(len(g) - 1 for g in groups if len(g) > 1)
    if dof == 0:
        return None
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups if len(g) > 1)
    return math.sqrt(ss / dof)


def t_quantile(degrees_of_freedom: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student t critical value (e.g. 4.303 for 2 degrees of freedom at 95%)."""
    from scipy.stats import t

    if degrees_of_freedom < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {degrees_of_freedom}")
    return float(t.ppf(0.5 + confidence / 2.0, degrees_of_freedom))


def mean_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The t interval of a mean; None below 2 values (no spread to scale it by)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def seeds_to_exclude_zero(mean_difference: float, std_difference: float, confidence: float = CONFIDENCE) -> int | None:
    """The smallest number of paired seeds whose interval would exclude 0 if the observed mean and std of the
    differences were the truth (a planning figure, not a power calculation). None: no difference was seen
    (mean 0), or it would take more than MAX_SEEDS."""
    if mean_difference == 0.0:
        return None
    if std_difference == 0.0:
        return 2
    for n in range(2, MAX_SEEDS + 1):
        if t_quantile(n - 1, confidence) * std_difference / math.sqrt(n) < abs(mean_difference):
            return n
    return None


@dataclass(frozen=True)
class PairedDifference:
    """``row`` minus ``baseline`` over the seeds both have: mean, std, n, the interval, and its verdict."""

    row: str
    baseline: str
    n: int
    mean: float | None
    std: float | None
    low: float | None
    high: float | None
    seeds_to_exclude_zero: int | None

    @property
    def verdict(self) -> str:
        """``above 0``, ``below 0``, ``includes 0`` or ``n < 2`` (no interval)."""
        if self.low is None or self.high is None:
            return "n < 2"
        if self.low > 0:
            return "above 0"
        if self.high < 0:
            return "below 0"
        return "includes 0"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict}


def paired_difference(row: str, row_values: Mapping[int, float], baseline: str,
                      baseline_values: Mapping[int, float], confidence: float = CONFIDENCE) -> PairedDifference:
    """``row - baseline`` on the seeds both measured (values keyed by seed)."""
    shared = sorted(set(row_values) & set(baseline_values))
    differences = [float(row_values[s]) - float(baseline_values[s]) for s in shared]
    n = len(differences)
    if n == 0:
        return PairedDifference(row, baseline, 0, None, None, None, None, None)
    mean = statistics.fmean(differences)
    if n < 2:
        return PairedDifference(row, baseline, 1, mean, None, None, None, None)
    std = statistics.stdev(differences)
    low, high = mean_interval(differences, confidence)  # type: ignore[misc]
    return PairedDifference(row, baseline, n, mean, std, low, high, seeds_to_exclude_zero(mean, std, confidence))
