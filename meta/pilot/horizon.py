"""The pilot's horizon check: does a search whose members train ``es.member_steps`` steps rank maps as runs of
``train.steps`` do?

A member of T steps is scored by its validation pass@1 at step T. Short-horizon objectives can prefer what helps
early over what is best at the end (Wu, Ren, Liao and Grosse, ICLR 2018); whether they do here is a measurement: the
pilot trains the centre and its antithetic pairs at the search's radius at both horizons on the same seeds, and this
module compares the two rankings of those maps (its text: results/report/pilot.py). Per map, its mean fitness over
the seeds on which both horizons finished; the Spearman rank correlation of the two means over the maps, with a
percentile bootstrap interval over maps (scipy); and a verdict:

- agree: the interval lies at or above AGREE_RHO: a T-step search ranks maps as the full run does;
- disagree: the interval lies below AGREE_RHO: it would rank them otherwise (the short-horizon bias);
- not settled: the interval holds AGREE_RHO. How many maps would settle it comes from the Fisher z interval of a
  Spearman coefficient (standard error sqrt(1.06 / (n - 3)), Fieller, Hartley and Pearson 1957) around the measured
  rho; how many seeds per map, from each horizon's seed noise against the spread between maps (the seeds at which
  the maps' means are 80% map and 20% seed noise; noise attenuates a correlation by the square root of that share).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from results.report.paired import CONFIDENCE, pooled_std

#: the rank correlation above which a T-step search is said to rank maps as the full run does: most of the full
#: ranking carried over (at rho 0.5 a map's short rank explains a quarter of the variance of its full rank)
AGREE_RHO = 0.5
#: the share of the per-map means' variance that should be the maps' own (not seed noise) for the seeds advised
RELIABILITY = 0.8
#: bootstrap resamples of the maps
RESAMPLES = 2000
#: a Spearman coefficient's variance factor in Fisher's z (Fieller, Hartley and Pearson 1957): var(z) = 1.06 / (n - 3)
SPEARMAN_Z_VARIANCE = 1.06
#: fewer maps than this leave no interval to speak of (Fisher's z needs n > 3)
MIN_MAPS = 4


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (scipy, ties averaged); None when undefined (fewer than 3 runs, constant scores)."""
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    value = float(spearmanr(a, b).statistic)
    return value if math.isfinite(value) else None


def _bootstrap(short: Sequence[float], full: Sequence[float], seed: int) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the Spearman rho over maps (resampled in pairs); None when undefined."""
    import numpy as np
    from scipy.stats import bootstrap, spearmanr

    def rho(a: Any, b: Any) -> float:
        return float(spearmanr(a, b).statistic)

    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():  # a resample of tied maps has no rank order: its rho is NaN, dropped below
            warnings.simplefilter("ignore")
            result = bootstrap((list(short), list(full)), rho, paired=True, vectorized=False, n_resamples=RESAMPLES,
                               method="percentile", confidence_level=CONFIDENCE, rng=np.random.default_rng(seed))
    values = np.asarray(result.bootstrap_distribution, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < RESAMPLES // 2:
        return None
    half = (1.0 - CONFIDENCE) / 2.0
    return float(np.quantile(values, half)), float(np.quantile(values, 1.0 - half))


def maps_to_settle(rho: float | None) -> int | None:
    """The maps at which the Fisher z interval around ``rho`` would leave out AGREE_RHO; None at AGREE_RHO itself."""
    from scipy.stats import norm

    if rho is None:
        return None
    clip = 1.0 - 1e-6
    distance = abs(math.atanh(max(-clip, min(clip, rho))) - math.atanh(AGREE_RHO))
    if distance < 1e-9:
        return None
    z = float(norm.ppf(0.5 + CONFIDENCE / 2.0))
    return max(MIN_MAPS, math.ceil(3 + SPEARMAN_Z_VARIANCE * (z / distance) ** 2))


def _noise(values: Sequence[Sequence[float]], means: Sequence[float]) -> dict[str, Any]:
    """One horizon's seed noise (pooled within-map std) and the spread between maps beyond it, and the seeds per map
    at which the maps' means are RELIABILITY their own."""
    std = pooled_std(values)
    seeds = statistics.fmean(len(v) for v in values) if values else 0.0
    between = (statistics.variance(means) - (std or 0.0) ** 2 / seeds) if len(means) > 1 and seeds else None
    out: dict[str, Any] = {"seed_std": std, "between_var": between, "seeds_needed": None}
    if std is not None and between is not None and between > 0.0:
        out["seeds_needed"] = max(1, math.ceil(RELIABILITY / (1.0 - RELIABILITY) * std * std / between))
    return out


def horizon_check(short: Sequence[Sequence[float | None]], full: Sequence[Sequence[float | None]], member_steps: int,
                  steps: int, seed: int, cost: Mapping[str, Any]) -> dict[str, Any]:
    """The check from each map's fitness per seed at member_steps (``short[i][s]``) and at train.steps (``full[i][s]``;
    None where a run is not final or failed); ``cost``: what its full-horizon runs took and would take (the caller's).
    """
    paired = [[(a, b) for a, b in zip(s, f) if a is not None and b is not None] for s, f in zip(short, full)]
    used = [p for p in paired if p]
    short_means = [statistics.fmean(a for a, _ in p) for p in used]
    full_means = [statistics.fmean(b for _, b in p) for p in used]
    seeds = max((len(p) for p in used), default=0)
    out: dict[str, Any] = {
        "member_steps": member_steps, "steps": steps, "maps": len(used), "maps_planned": len(short), "seeds": seeds,
        "short_means": short_means, "full_means": full_means, "rho": None, "low": None, "high": None,
        "agree_rho": AGREE_RHO, "reliability": RELIABILITY, "verdict": "not measured", "maps_needed": None, "seeds_needed": None, **cost,
        "short": _noise([[a for a, _ in p] for p in used], short_means),
        "full": _noise([[b for _, b in p] for p in used], full_means),
    }
    if len(used) < MIN_MAPS:
        out["sentence"] = (f"not measured: {len(used)} map(s) finished at both horizons, {MIN_MAPS} needed for a rank "
                           "correlation with an interval")
        out["advice"] = "finish (or resume) the pilot's runs"
        return out
    rho = spearman(short_means, full_means)
    interval = _bootstrap(short_means, full_means, seed) if rho is not None else None
    needed = [h["seeds_needed"] for h in (out["short"], out["full"]) if h["seeds_needed"] is not None]
    out.update(rho=rho, low=interval[0] if interval else None, high=interval[1] if interval else None,
               maps_needed=maps_to_settle(rho), seeds_needed=max(needed) if needed else None)
    out["verdict"], out["sentence"], out["advice"] = _verdict(out)
    return out


def _verdict(check: Mapping[str, Any]) -> tuple[str, str, str]:
    t, s, n, k = check["member_steps"], check["steps"], check["maps"], check["seeds"]
    rho, low, high = check["rho"], check["low"], check["high"]
    measured = (f"Spearman rho {rho:+.2f} [{low:+.2f}, {high:+.2f}] over {n} maps x {k} seed(s)" if low is not None
                else f"Spearman rho {_fmt(rho)} over {n} maps x {k} seed(s), no interval (the maps' scores tie)")
    nres = ("es=nres (online ES: each particle one run of train.steps cut into truncations, its estimate aimed at the "
            "full run's pass@1, at about one run per particle)")
    if low is not None and low >= AGREE_RHO:
        return ("agree", f"{t}-step members rank maps as {s}-step runs do: {measured}, at or above {AGREE_RHO:g}. A "
                         f"search with es.member_steps={t} ranks maps as the full run does, at {t / s:.3g} of its "
                         "member-steps.",
                f"take es.member_steps={t}")
    if high is not None and high < AGREE_RHO:
        return ("disagree", f"{t}-step members do not rank maps as {s}-step runs do: {measured}, below "
                            f"{AGREE_RHO:g}. A search with es.member_steps={t} would favour maps that help over the "
                            f"first {t} steps, not the best at step {s} (short-horizon bias).",
                f"do not search with es.member_steps={t}: use {nres}, or a longer es.member_steps checked again")
    maps = check["maps_needed"]
    seeds = check["seeds_needed"]
    settle = (f"about {maps} maps (pilot.pairs={math.ceil((maps - 1) / 2)})" if maps is not None else
              "more maps than any pilot affords (rho sits at the threshold)")
    settle += f" and {seeds} seed(s) per map (pilot.seeds)" if seeds is not None else ""
    return ("not settled", f"not settled: {measured} holds {AGREE_RHO:g}, so it fits a {t}-step search that ranks "
                           f"maps as the full run does and one that does not. {settle[0].upper()}{settle[1:]} would "
                           "settle it.",
            f"until it is settled, {nres} avoids the question; or run the pilot again with more maps and seeds")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"
