"""How often would early_stop cut a member that the full run puts among the members the update weighs? Measured on
finished runs' learning curves (``train.eval_every``), before anything is cut for real.

    python -m meta.early_cuts RUN_DIR [RUN_DIR ...] [--fractions 0.25 0.333 0.5] [--margins 0 1 2] [--noise X]

A search dir: each generation's population is one sample (its values, its centre, each member's intermediate and
final scores). A pilot dir (meta.pilot with train.eval_every): for each seed, the perturbed inits c +- e_i trained on
that seed form one population (common random numbers, as in a generation). Per decision fraction f (step
round(f x train.steps), an intermediate validation step) and margin k:

- the plain false-cut rate: of the members the update weighs (the top N - floor(N/2) by final fitness), the share
  that were below the median early (what a cut at the median alone would lose), with a Clopper-Pearson 95% interval
  over the members measured;
- the rule (meta/search/generation/early_stop.py, every member reported, margin k x noise): the members it stops, the share of them
  that were in fact weighed (false cuts), the training it saves, and per searcher it is exact for (with the
  settings each declares: meta/searchers) the cosine between the centre's update with the stopped members at the
  bottom and the update from the final scores (1.0: the same direction; exact when no cut was false);

``noise`` (the spread of an early score across seeds of one init) defaults to the pilot's pooled estimate when a
pilot dir is given, else the pooled within-population spread is not a seed spread: pass --noise.
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from meta.search.generation.early_stop import EarlyStopConfig, EarlyStopJudge, update_fitness
from meta.search.config import param_transform_of
from meta.search.generation.generation_shape import GenerationShape
from meta.search.init import initial_center
from meta.settings.schema import SearchSchema, train_steps
from meta.searchers import build_searcher
from meta.settings.upgrade import stored_config
from results.store.member_files import read_intermediate, read_result
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)



def exact_searchers() -> dict[str, dict[str, Any]]:
    """The searchers early stopping is exact for, each with the settings it declares for that (the cosine's)."""
    from meta.searchers import searchers

    return {name: dict(cls.early_stop.example) for name, cls in searchers().items() if cls.early_stop is not None}


#: the decision points the figures are computed at (T/4, T/3, T/2) and the margins k (x noise)
DEFAULT_FRACTIONS = (0.25, 1 / 3, 0.5)
DEFAULT_MARGINS = (0.0, 1.0, 2.0)


@dataclass
class Population:
    """One generation-like sample: member values around a centre, with learning curves and final fitness."""

    label: str
    center: torch.Tensor
    values: torch.Tensor
    curves: list[dict[int, float]]
    final: list[float]


def _config(store: RunStore) -> dict[str, Any]:
    return stored_config(store)


def search_populations(store: RunStore) -> list[Population]:
    """Every finished generation of a search whose members all finished ok with intermediate scores."""
    raw = _config(store)
    population = int(raw["population"])
    center = initial_center(str(raw.get("init", SearchSchema.init)), int(raw.get("seed", SearchSchema.seed)),
                            param_transform_of(raw)).to(torch.float64)
    found = []
    for generation in sorted(store.state_generations()):
        values = store.read_population(generation)
        records = [read_result(store.member_dir(generation, i)) for i in range(population)]
        curves = [read_intermediate(store.member_dir(generation, i)) for i in range(population)]
        if values is not None and all(r is not None and r.ok for r in records) and all(curves):
            found.append(Population(f"{store.root.name} gen {generation}", center, values.to(torch.float64), curves,
                                    [r.fitness for r in records if r is not None]))
        center = store.read_state(generation)["center"].to(torch.float64)
    return found


def pilot_populations(store: RunStore) -> tuple[list[Population], float | None]:
    """Per seed, the pilot's perturbed inits trained on it; and the pooled seed-to-seed std of early scores of one
    init (every init's seeds, at every step; None with fewer than 2 seeds)."""
    plan = store.read_pilot_plan() or {}
    centre = torch.tensor(plan["centre"], dtype=torch.float64)
    directions = torch.tensor(plan["directions"], dtype=torch.float64)
    radius = float(plan["combinations"][0]["radius"])
    by_seed: dict[int, list[tuple[torch.Tensor, dict[int, float], float]]] = {}
    by_init: dict[tuple[str, Any], list[dict[int, float]]] = {}
    for member in plan["members"]:
        if int(member["combination"]) != 0:
            continue
        record = read_result(member["work_dir"])
        curve = read_intermediate(member["work_dir"])
        if record is None or not record.ok or not curve:
            continue
        by_init.setdefault((member["role"], member["pair"]), []).append(curve)
        if member["role"] == "centre":
            continue
        sign = 1.0 if member["role"] == "plus" else -1.0
        value = centre + sign * radius * directions[int(member["pair"])]
        by_seed.setdefault(int(member["seed_index"]), []).append((value, curve, record.fitness))
    populations = [Population(f"{store.root.name} seed {s}", centre, torch.stack([m[0] for m in members]),
                              [m[1] for m in members], [m[2] for m in members])
                   for s, members in sorted(by_seed.items()) if len(members) >= 4]
    return populations, _pooled_seed_std(list(by_init.values()))


def _pooled_seed_std(inits: list[list[dict[int, float]]]) -> float | None:
    """sqrt of the pooled within-init variance of early scores, over inits and steps."""
    squares, dof = 0.0, 0
    for curves in inits:
        if len(curves) < 2:
            continue
        for step in set.intersection(*(set(c) for c in curves)):
            values = [c[step] for c in curves]
            squares += statistics.variance(values) * (len(values) - 1)
            dof += len(values) - 1
    return math.sqrt(squares / dof) if dof else None


def weighed_members(final: Sequence[float]) -> set[int]:
    """The members the update weighs: the top N - floor(N/2) by final fitness (nes's positive ranks, cem's parents
    at parenthood_ratio 0.5)."""
    n = len(final)
    return set(sorted(range(n), key=lambda i: final[i], reverse=True)[: n - n // 2])


def rule_stops(early: Sequence[float], step: int, margin: float, noise: float) -> list[bool]:
    """Which members early_stop's rule stops when every member of a population has reported ``early`` at
    ``step`` (its judge, capacity floor(N/2)), as a mask."""
    n = len(early)
    # at_fraction only names the step in a config; the judge decides at ``step``
    config = EarlyStopConfig(enabled=True, at_fraction=0.5, min_reported=1.0, margin=margin, noise=noise)
    judge = EarlyStopJudge(config, step, GenerationShape(population=n, early_stop_capacity=n // 2))
    judge.decide(dict(enumerate(early)), set(range(n)))
    stopped = set(judge.stopped())
    return [i in stopped for i in range(n)]


def _update(es: dict[str, Any], population: Population, fitness: Sequence[float]) -> torch.Tensor:
    searcher = build_searcher(es, population.center, len(fitness), 0)
    searcher.tell(0, population.values, torch.tensor(fitness, dtype=torch.float64),
                  torch.ones(len(fitness), dtype=torch.bool))
    return searcher.center - population.center


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norms = float(a.norm() * b.norm())
    return float(a @ b) / norms if norms > 0 else float("nan")


def _pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Correlation of early and final scores within one population (nan when either is constant)."""
    if len(a) < 3 or statistics.pstdev(a) == 0 or statistics.pstdev(b) == 0:
        return float("nan")
    return statistics.correlation(a, b)


def _interval(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def study(populations: Sequence[Population], steps: int, fractions: Sequence[float], margins: Sequence[float],
          noise: float) -> list[dict[str, Any]]:
    """One row per (fraction, margin): false cuts, stops, saving, update cosines; see the module docstring."""
    rows = []
    exact = exact_searchers()
    for fraction in fractions:
        step = round(fraction * steps)
        usable = [p for p in populations if all(step in c for c in p.curves)]
        for margin in margins:
            weighed = plain_false = stopped_total = false_cuts = members = 0
            cosines: dict[str, list[float]] = {name: [] for name in exact}
            correlations = []
            for population in usable:
                n = len(population.final)
                early = [c[step] for c in population.curves]
                correlations.append(_pearson(early, population.final))
                top = weighed_members(population.final)
                early_median = statistics.median(early)
                plain_false += sum(1 for i in top if early[i] < early_median)
                mask = rule_stops(early, step, margin, noise)
                weighed += len(top)
                members += n
                stopped_total += sum(mask)
                false_cuts += sum(1 for i in top if mask[i])
                for name, es in exact.items():
                    full = _update(es, population, population.final)
                    cut = _update(es, population, update_fitness(population.final, mask))
                    cosines[name].append(_cosine(full, cut))
            low, high = _interval(plain_false, weighed)
            rows.append({
                "fraction": fraction, "step": step, "margin": margin, "populations": len(usable),
                "members": members, "weighed": weighed,
                "correlation": statistics.fmean(c for c in correlations if not math.isnan(c))
                if any(not math.isnan(c) for c in correlations) else float("nan"),
                "median_split_false_cut": plain_false / weighed if weighed else float("nan"),
                "median_split_interval": (low, high),
                "stopped": stopped_total, "false_cuts": false_cuts,
                "false_cut_of_weighed": false_cuts / weighed if weighed else float("nan"),
                "false_cut_interval": _interval(false_cuts, weighed),
                "saving": stopped_total / members * (1.0 - step / steps) if members else float("nan"),
                "cosine": {name: (statistics.fmean(v) if v else float("nan"), min(v) if v else float("nan"))
                           for name, v in cosines.items()},
            })
    return rows


def format_rows(rows: Sequence[dict[str, Any]], noise: float) -> str:
    lines = [f"noise of an early score (seed-to-seed std of one init): {noise:.4f}",
             "within-population correlation of early and final scores, mean over populations: "
             + ", ".join(f"step {r['step']}: {r['correlation']:.3f}" for r in rows if r["margin"] == rows[0]["margin"]),
             "fraction step | median split: false cuts of weighed [95% CI] | margin k: stopped, false cuts of "
             "weighed [95% CI], member time saved | cosine to the full update, mean (min): "
             + ", ".join(exact_searchers())]
    for r in rows:
        lo, hi = r["median_split_interval"]
        flo, fhi = r["false_cut_interval"]
        cos = ", ".join(f"{name} {mean:.3f} ({low:.3f})" for name, (mean, low) in r["cosine"].items())
        lines.append(
            f"{r['fraction']:.3f} {r['step']:>4d} | {r['median_split_false_cut']:.3f} [{lo:.3f}, {hi:.3f}] of "
            f"{r['weighed']} | k={r['margin']:g}: {r['stopped']}/{r['members']} stopped, "
            f"{r['false_cut_of_weighed']:.3f} [{flo:.3f}, {fhi:.3f}], saving {r['saving']:.3f} | {cos}")
    return "\n".join(lines)


def report_text(run_dirs: Sequence[str | Path], fractions: Sequence[float] = DEFAULT_FRACTIONS,
                margins: Sequence[float] = DEFAULT_MARGINS, noise: float | None = None) -> str:
    """The figures for these run dirs as text; ValueError naming what is missing."""
    populations: list[Population] = []
    steps = None
    for run_dir in run_dirs:
        store = RunStore(run_dir)
        if not store.exists():
            raise ValueError(f"{run_dir} is not a run dir (no config.yaml)")
        config = _config(store)
        if not (config.get("train") or {}).get("eval_every"):
            raise ValueError(f"{run_dir} ran without train.eval_every: no learning curves")
        if steps not in (None, train_steps(config)):
            raise ValueError("the run dirs train for different train.steps")
        steps = train_steps(config)
        if store.read_pilot_plan() is not None:
            found, pilot_noise = pilot_populations(store)
            noise = noise if noise is not None else pilot_noise
        else:
            found = search_populations(store)
        populations += found
    if noise is None:
        raise ValueError("no seed-to-seed noise of early scores: give a pilot dir (2+ seeds) or --noise")
    if not populations or steps is None:
        raise ValueError("no finished population with learning curves in these run dirs")
    rows = [r for r in study(populations, steps, fractions, margins, noise) if r["populations"]]
    if not rows:
        raise ValueError(f"no population reported at the steps of fractions {list(fractions)} of {steps} steps")
    return (f"{len(populations)} population(s): {', '.join(p.label for p in populations)}\n"
            + format_rows(rows, noise) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.early_cuts", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="search or pilot run dirs with intermediate scores")
    parser.add_argument("--fractions", nargs="+", type=float, default=list(DEFAULT_FRACTIONS))
    parser.add_argument("--margins", nargs="+", type=float, default=list(DEFAULT_MARGINS))
    parser.add_argument("--noise", type=float, default=None, help="early-score seed std (default: the pilot's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        text = report_text(args.run_dirs, args.fractions, args.margins, args.noise)
    except ValueError as exc:
        sys.stderr.write(f"early_cuts error: {exc}\n")
        return 2
    sys.stdout.write(text)
    return 0
