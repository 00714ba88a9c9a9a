"""The statistics of antithetic pair differences that the pilot's findings share: the whole runs'
(meta/pilot/findings.py) and each truncation phase's (meta/pilot/truncation.py) are the same computation on other
differences.

For pair i and seed s, d_is is the difference between the +e_i and the -e_i init trained on seed s; m_i is its mean
over the k_i usable seeds. sigma_n^2 is the pooled within-pair variance of d_is (nu = sum(k_i - 1) dof), sigma_s^2 =
max(mean_i(m_i^2 - sigma_n^2 / k_i), 0) (about 0, since E[d] = 0 exactly), and F = (sum_i k_i m_i^2 / m) / sigma_n^2
~ F(m, nu) under no signal (docs/pilot.md "What each number means").
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

#: the F-test's level: differences "have signal" when the pair means' spread exceeds noise at this level (the
#: summary records it for its text)
SIGNIFICANCE = 0.05


def ceil_int(x: float) -> int:
    """ceil that does not round 2.0000000000000004 (a float ratio meant as 2) up to 3."""
    return math.ceil(x - 1e-9)


def pair_row(pair: int, diffs: Sequence[float | None]) -> dict[str, Any]:
    """One pair's differences per seed (None: a run not final or failed), their usable count and mean."""
    usable = [d for d in diffs if d is not None]
    return {"pair": pair, "diffs": list(diffs), "n": len(usable), "mean": statistics.fmean(usable) if usable else None}


def f_test(pair_means: Sequence[float], pair_seeds: Sequence[int], noise_var: float,
           dof: int) -> tuple[float | None, float]:
    """(F, p-value) of "the pair means spread no more than seed noise": F = (sum k_i m_i^2 / m) / sigma_n^2 ~ F(m, nu)
    under no signal. With sigma_n^2 = 0, F is undefined (None): any non-zero pair mean is then signal (p = 0)."""
    from scipy.stats import f as f_dist

    numerator = sum(k * m * m for m, k in zip(pair_means, pair_seeds)) / len(pair_means)
    if noise_var <= 0.0:
        return None, (0.0 if numerator > 0.0 else 1.0)
    value = numerator / noise_var
    return value, float(f_dist.sf(value, len(pair_means), dof))


def variance_split(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, int] | None:
    """(sigma_n^2, sigma_s^2, nu) of pair rows; None when no pair has two usable seeds (no noise estimate)."""
    within = [p for p in rows if p["n"] >= 2]
    dof = sum(p["n"] - 1 for p in within)
    if dof == 0:
        return None
    noise = sum(sum((d - p["mean"]) ** 2 for d in p["diffs"] if d is not None) for p in within) / dof
    used = [p for p in rows if p["n"] >= 1]
    signal = max(statistics.fmean(p["mean"] ** 2 - noise / p["n"] for p in used), 0.0)
    return noise, signal, dof


def pair_snr(rows: Sequence[Mapping[str, Any]], population: int, seeds_per_member: int) -> dict[str, Any]:
    """Noise and signal variance of the pair rows, the F-test, and the SNR of one ES step that reads P/2 such
    differences of r seeds each: (P/2) sigma_s^2 / (sigma_n^2 / r)."""
    out: dict[str, Any] = {"noise_var": None, "noise_dof": 0, "signal_var": None, "pairs_used": 0, "f": None,
                           "p_value": None, "signal": False, "snr": None, "snr_estimate": None, "noise_free": False,
                           "reason": None}
    split = variance_split(rows)
    if split is None:
        out["reason"] = "not measured yet: no pair has two usable seeds"
        return out
    noise, signal, dof = split
    used = [p for p in rows if p["n"] >= 1]
    f_value, p_value = f_test([p["mean"] for p in used], [p["n"] for p in used], noise, dof)
    out.update(noise_var=noise, noise_dof=dof, signal_var=signal, pairs_used=len(used), f=f_value, p_value=p_value)
    if noise > 0.0:
        out["snr_estimate"] = population / 2.0 * signal / (noise / seeds_per_member)
    if signal <= 0.0 or p_value >= SIGNIFICANCE:
        out["reason"] = ("sigma_s^2 estimate is 0" if signal <= 0.0 else
                         f"F-test p = {p_value:.3f} >= {SIGNIFICANCE}: the pair means spread no more than seed noise")
        return out
    out["signal"] = True
    if noise > 0.0:
        out["snr"] = out["snr_estimate"]
    else:
        out["noise_free"] = True  # differences repeat exactly over seeds: any population sees the signal
    return out
