"""The pilot's truncation check for an online searcher (es=nres): does a truncation's change of validation pass@1
carry signal, phase by phase, and which population, truncation length and step follow? (Its text:
results/report/pilot.py; its rule and reasoning: docs/pilot.md "The truncation check".)

es=nres trains each antithetic pair as one run of train.steps cut into truncations of T steps; a member's fitness is
its change of validation pass@1 over its truncation, and the centre moves by the pairs' differences of those changes
(es.update: after every truncation, or summed over a run when it ends). The pilot's runs are such whole runs, validated every T steps on the whole validation set, so for pair
i, seed s and phase k (steps [kT, (k+1)T)) the pair difference is

    d_isk = (s+((k+1)T) - s+(kT)) - (s-((k+1)T) - s-(kT)),

with s+(0) = s-(0) (both start from the same model, which the map has not touched yet). The phases' differences sum
to the difference of the two runs' final scores: an episode (one run per particle) carries what one whole-run ES
step carries. Per phase, and for the sum, the pair statistics of meta/pilot/pairs.py: the SNR of an update that reads
phase k at population P is (P/2) sigma_s,k^2 / sigma_n,k^2, the per-episode one (P/2) sigma_s^2 / sigma_n^2 of the
sums.

The recommendation (for pilot.target_snr = S_t):
- population P* = 2 ceil(S_t / u), u = sigma_s^2 / sigma_n^2 of the episode: the moves of an episode add up to one
  whole-run estimate, which must reach the target; "cannot see anything at this budget" when P* whole particle runs
  are more than the configured search trains in all (population x generations truncations);
- T: with es.update reading every truncation's change, T* = the smallest multiple of the measured T whose every phase
  is resolved (the median |d| of a phase at least one problem, 1/V: an update that reads ties moves the centre by
  noise alone; none below train.steps: nres's truncations cannot see anything); with es.update summing a run's
  changes before it reads them, the measured T (T then sets how often runs end and what their starts cost, not what
  an update sees);
- step: the configured es step times S/(1+S), S the SNR of what one update reads at P*: a truncation's change (the
  mean per-update SNR at T*; stagger: the phases' pooled signal over their pooled noise, every update mixing them), or
  a whole run's (the episode's). For a gradient estimate whose signal share of its variance is S/(1+S), the best
  step on a smooth objective is that share of the noise-free one, which the configured step (a move at a clear
  signal) is taken to be.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from meta.pilot.pairs import ceil_int, pair_row, pair_snr, variance_split

#: es=nres's step setting (conf/es/nres.yaml: the centre's move per episode in radii, at a clear signal), which the
#: recommendation scales; its value (and so its default) is always read from the composed config
STEP_KEY = "step_radii"
#: es=nres's update setting: whether every truncation's change moves the centre, or a run's changes summed
UPDATE_KEY = "update"
#: es=nres's truncation length setting (null: train.steps / 16), which the recommendation sets
TRUNCATION_KEY = "truncation_steps"
#: an evaluation of "the whole validation set" as train.eval_subset can say it: the first this many problems (the
#: subset is a slice, so every problem; train.eval_subset has no "all")
WHOLE_VALIDATION = 2**31 - 1

PhaseDiffs = Sequence[Sequence[Sequence[float] | None]]  # [pair][seed] -> the K phase differences, None: unusable


@dataclass(frozen=True)
class TruncationSettings:
    """What the check's conclusions depend on besides the runs: the measured T and the search it speaks for."""

    truncation_steps: int  # T the pilot's runs were validated at
    horizon: int  # train.steps: a particle's run
    population: int
    generations: int
    target_snr: float
    stagger: bool  # es.stagger: every update mixes the phases
    step: float | None  # the configured es.<STEP_KEY>
    per_truncation: bool  # es.update reads every truncation's change (the papers' step), not a whole run's sum
    budget_steps: int | None  # member-steps of the configured search (its planned truncations)


def boundaries(horizon: int, length: int) -> list[int]:
    """The steps where the phases end: T, 2T, ..., train.steps (the last phase may be shorter)."""
    return [min(k * length, horizon) for k in range(1, math.ceil(horizon / length) + 1)]


def phase_differences(plus: Mapping[int, float], minus: Mapping[int, float],
                      bounds: Sequence[int]) -> list[float] | None:
    """d_k of one pair on one seed from its two runs' scores at the boundaries (the last: the final fitness); None
    when a boundary's score is missing for either run."""
    if any(b not in plus or b not in minus for b in bounds):
        return None
    before, out = 0.0, []
    for b in bounds:
        gap = plus[b] - minus[b]
        out.append(gap - before)
        before = gap
    return out


def _merged(diffs: PhaseDiffs, j: int) -> list[list[list[float] | None]]:
    """The differences of phases j times as long: each run's consecutive phases summed in groups of j."""
    return [[None if d is None else [sum(d[a:a + j]) for a in range(0, len(d), j)] for d in pair] for pair in diffs]


def _phase_rows(diffs: PhaseDiffs, k: int) -> list[dict[str, Any]]:
    return [pair_row(i, [None if d is None else d[k] for d in pair]) for i, pair in enumerate(diffs)]


def _phase_count(diffs: PhaseDiffs) -> int:
    return next((len(d) for pair in diffs for d in pair if d is not None), 0)


def _median_abs(rows: Sequence[Mapping[str, Any]]) -> float | None:
    values = [abs(d) for p in rows for d in p["diffs"] if d is not None]
    return statistics.median(values) if values else None


def _resolved(median_abs: float | None, resolution: float | None) -> bool | None:
    """Whether a phase's pairs mostly differ by at least one problem; None when unknown."""
    if median_abs is None or resolution is None:
        return None
    return median_abs >= resolution * (1.0 - 1e-9)


def _ratio(signal: float, noise: float) -> float:
    """sigma_s^2 / sigma_n^2, infinite for signal without noise."""
    if noise > 0.0:
        return signal / noise
    return math.inf if signal > 0.0 else 0.0


def _phase(rows: Sequence[Mapping[str, Any]], k: int | None, start: int, stop: int, population: int,
           resolution: float | None) -> dict[str, Any]:
    """One phase's (or, k None, the episode's) statistics."""
    values = [d for p in rows for d in p["diffs"] if d is not None]
    stats = pair_snr(rows, population, 1)
    median_abs = _median_abs(rows)
    return {"phase": k, "start": start, "stop": stop, "n": len(values),
            "mean": statistics.fmean(values) if values else None,
            "sd": statistics.stdev(values) if len(values) > 1 else None, "median_abs": median_abs,
            "resolved": _resolved(median_abs, resolution),
            **{key: stats[key] for key in ("noise_var", "signal_var", "noise_dof", "f", "p_value", "signal", "snr",
                                           "snr_estimate", "noise_free", "reason")}}


def update_snr(diffs: PhaseDiffs, population: int, stagger: bool) -> float | None:
    """The SNR one update carries at ``population``, over the phases: the mean of (P/2) sigma_s,k^2 / sigma_n,k^2
    (pairs restart together: update k reads phase k), or with ``stagger`` (every update mixes the phases)
    (P/2) mean_k sigma_s,k^2 / mean_k sigma_n,k^2; None when no phase has a noise estimate."""
    splits = [variance_split(_phase_rows(diffs, k)) for k in range(_phase_count(diffs))]
    splits = [s for s in splits if s is not None]
    if not splits:
        return None
    if stagger:
        ratio = _ratio(statistics.fmean(s for _, s, _ in splits), statistics.fmean(n for n, _, _ in splits))
    else:
        ratio = statistics.fmean(_ratio(s, n) for n, s, _ in splits)
    return population / 2.0 * ratio


def shortest_resolved(diffs: PhaseDiffs, resolution: float | None) -> int:
    """The smallest j (phases merged j at a time) at which every merged phase is resolved; the phase count (the whole
    run, always taken) when none shorter is, 1 when the resolution is unknown."""
    count = _phase_count(diffs)
    if resolution is None:
        return 1
    for j in range(1, count):
        merged = _merged(diffs, j)
        if all(_resolved(_median_abs(_phase_rows(merged, k)), resolution) for k in range(_phase_count(merged))):
            return j
    return max(count, 1)


def truncation_check(diffs: PhaseDiffs, val_size: int | None, settings: TruncationSettings) -> dict[str, Any]:
    """The per-phase table, the episode's and the updates' SNR at the configured population, and the
    recommendation (module docstring); ``diffs[i][s]``: pair i's K phase differences on seed s."""
    T, H, P = settings.truncation_steps, settings.horizon, settings.population
    bounds = boundaries(H, T)
    resolution = 1.0 / val_size if val_size else None
    usable = [d for pair in diffs for d in pair if d is not None]
    if any(len(d) != len(bounds) for d in usable):
        raise ValueError(f"phase differences of {sorted({len(d) for d in usable})} phases, not the "
                         f"{len(bounds)} of train.steps={H} cut every {T}")
    starts = [0, *bounds[:-1]]
    phases = [_phase(_phase_rows(diffs, k), k, starts[k], bounds[k], P, resolution) for k in range(len(bounds))]
    episode_rows = [pair_row(i, [None if d is None else sum(d) for d in pair]) for i, pair in enumerate(diffs)]
    episode = _phase(episode_rows, None, 0, H, P, resolution)
    return {"truncation_steps": T, "horizon": H, "phases": phases, "episode": episode,
            "val_size": val_size, "resolution": resolution, "usable": len(usable),
            "planned": sum(len(pair) for pair in diffs), "population": P, "stagger": settings.stagger,
            "update_snr": update_snr(diffs, P, settings.stagger),
            "phases_with_signal": sum(1 for p in phases if p["signal"]),
            "recommendation": recommend(diffs, episode, resolution, settings)}


def recommend(diffs: PhaseDiffs, episode: Mapping[str, Any], resolution: float | None,
              settings: TruncationSettings) -> dict[str, Any]:
    """Population, truncation length and step for es=nres, or why it cannot see anything (module docstring)."""
    T, H, target = settings.truncation_steps, settings.horizon, settings.target_snr
    out: dict[str, Any] = {"visible": False, "reason": None, "target_snr": target, "population": None,
                           "per_truncation": settings.per_truncation, "truncation_key": TRUNCATION_KEY,
                           "truncation_steps": None, "resolved_steps": None, "step_snr": None, "step_key": STEP_KEY,
                           "step_configured": settings.step, "step_factor": None, "step": None,
                           "budget_particles": None, "budget_snr": None}
    if episode["noise_var"] is None:
        out["reason"] = f"not measured: {episode['reason']}"
        return out
    if not episode["signal"]:
        out["reason"] = (f"no signal in whole particle runs (the sum over the phases): {episode['reason']}; nres "
                         "cannot see anything that whole-run ES cannot")
        return out
    u = _ratio(episode["signal_var"], episode["noise_var"])
    population = 2 * max(1, ceil_int(target / u)) if math.isfinite(u) else 2
    out["population"] = population
    if settings.budget_steps is not None:
        particles = settings.budget_steps / H
        out.update(budget_particles=particles, budget_snr=particles / 2.0 * u)
        if population > particles:
            out["reason"] = (f"nres cannot see anything at this budget: population {settings.population} x "
                             f"generations {settings.generations} trains {settings.budget_steps} member-steps, "
                             f"{particles:.3g} whole particle runs, whose one estimate would carry SNR "
                             f"{particles / 2.0 * u:.3g}, below the target {target:g}; an episode at the target "
                             f"needs {population} particles")
            return out
    j = shortest_resolved(diffs, resolution)
    resolved = min(j * T, H)
    if settings.per_truncation:  # every update reads one truncation's changes: they must resolve, and carry signal
        length, snr = resolved, update_snr(_merged(diffs, j), population, settings.stagger)
    else:  # a run's changes are summed before they are read: each update carries a whole run's SNR
        length, snr = T, population / 2.0 * u
    factor = 1.0 if snr is None or math.isinf(snr) else snr / (1.0 + snr)
    out.update(truncation_steps=length, resolved_steps=resolved, step_snr=snr, step_factor=factor,
               step=None if settings.step is None else settings.step * factor)
    if settings.per_truncation and j >= _phase_count(diffs) > 1:
        out["reason"] = (f"nres's truncations cannot see anything: no truncation shorter than the run (multiples of "
                         f"T={T}) has every phase's median pair difference at or above one problem (1/V = "
                         f"{resolution:.4g}); whole runs (es.{TRUNCATION_KEY}={H}, or the es.{UPDATE_KEY} that sums a "
                         f"run's truncations before it reads them) need population {population}")
        return out
    out["visible"] = True
    return out
