"""The findings of a ``meta.pilot`` run: seed noise, paired differences, the ES step's signal-to-noise ratio, and the
settings that would reach a target SNR; ``python -m results.report RUN_DIR`` shows them (its text:
results/report/pilot.py) from the pilot.json that meta.pilot writes with them.

The pilot (meta/pilot/cli.py) asks one question before a search spends its budget: at these settings, do the members'
fitness differences carry more signal than seed noise? Everything here is computed from files alone (the plan,
config.yaml and each run's result.json); meta.pilot writes this summary as pilot.json each time a run becomes final
(``complete`` false until every run is), so the report of an unfinished or killed pilot shows what its finished runs
already said.

How the SNR is estimated (meta/pilot/pairs.py computes it; docs/pilot.md has the derivation). For pair i and seed s,
d_is = f(c+e_i, s) - f(c-e_i, s); both inits train on seed s, so whatever the seed does to both cancels. Per pair,
m_i = mean over its k_i usable seeds.
- noise variance of ONE single-seed difference: sigma_n^2 = pooled within-pair variance of d_is (nu = sum(k_i - 1) dof);
- signal variance: sigma_s^2 = max(mean_i(m_i^2 - sigma_n^2 / k_i), 0). The m_i are centred on 0 exactly (e_i and -e_i
  are equally likely, so E[d] = 0): their second moment about 0 is used, which needs no pair for a mean, so one pair
  (pilot.pairs=1) already gives an estimate;
- SNR of one generation's ES step at population P with r seeds per member: (P/2) sigma_s^2 / (sigma_n^2 / r);
- "no signal" when sigma_s^2 is 0 or not distinguishable from 0 by an F-test at 5%: under no signal every m_i is
  N(0, sigma_n^2 / k_i), so F = (sum_i k_i m_i^2 / m) / sigma_n^2 follows F(m, nu); signal only when
  P(F(m, nu) >= F) < 5%.

Scale apart from direction. Every perturbed init is a map drawn at the search's radius around the centre; per seed s,
the mean of their fitness minus the centre's (both on seed s) is what a step of that size gives whatever its direction
(the map's scale: a larger neural map is partly a stronger regularizer); its t interval is over the k seeds. The pair
differences above are what a direction adds, the only part a search can read. Which of the two a search at that
radius would buy decides the advice: a radius to search at, or a coefficient to tune instead.

For an online searcher (es=nres) the same statistics per truncation phase: the truncation check (meta/pilot/
truncation.py), from the runs' validations every es.truncation_steps steps.
"""
from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from core.gpu_time import GpuSharing, gpu_sharing, gpu_time_h
from core.records import ResultRecord
from meta.pilot.horizon import horizon_check, spearman
from meta.pilot.pairs import SIGNIFICANCE, ceil_int, pair_row, pair_snr
from meta.pilot.truncation import (STEP_KEY, TRUNCATION_KEY, UPDATE_KEY, TruncationSettings, boundaries,
                                   phase_differences, truncation_check)
from meta.settings.member_time import short_run_overhead_key
from meta.settings.upgrade import stored_config, stored_manifest
from results.report.paired import mean_interval
from results.report.pilot import PILOT_KIND, num_text
from results.store.member_files import read_intermediate, read_result
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)

CENTRE, PLUS, MINUS = "centre", "plus", "minus"
#: the ``horizon`` of a pilot run that trains train.steps for the horizon check (the other runs train es.member_steps)
FULL_HORIZON = "full"


@dataclass(frozen=True)
class PilotContext:
    """What the findings depend on besides the runs: the search the pilot speaks for (config.yaml as last written;
    population, target_snr and generations may change when a pilot is resumed, the runs may not)."""

    population: int
    generations: int
    seeds_per_member: int
    seeds_per_member_set: bool  # False: the config has no seeds_per_member key (one run per member)
    target_snr: float
    gpus: int
    cpus: int
    member_time_min: float | None
    eval_every: int | None
    sharing: GpuSharing  # members per GPU and their slowdown: a member's expected time and its GPU time
    es: Mapping[str, Any] = field(default_factory=dict)  # the es node: an online searcher's truncation settings
    short_run_overhead_min: float = 0.0  # the fixed minutes of a member shorter than the run (an nres truncation)


def pilot_context(raw: Mapping[str, Any]) -> PilotContext:
    """The context from a resolved config (meta.pilot's, or a pilot run dir's config.yaml)."""
    resources = raw.get("resources") or {}
    per_member = raw.get("seeds_per_member")
    train = raw.get("train") or {}
    return PilotContext(
        population=int(raw["population"]), generations=int(raw["generations"]),
        seeds_per_member=int(per_member) if per_member is not None else 1,
        seeds_per_member_set=per_member is not None,
        target_snr=float(raw["pilot"]["target_snr"]),
        gpus=int(resources.get("gpus") or 0), cpus=int(resources.get("cpus") or 1),
        member_time_min=float(resources["member_time_min"]) if resources.get("member_time_min") else None,
        eval_every=int(train["eval_every"]) if train.get("eval_every") else None,
        sharing=gpu_sharing(resources),
        es=dict(raw.get("es") or {}),
        short_run_overhead_min=float(resources.get(short_run_overhead_key(resources)) or 0.0),
    )


def member_index(combination: int, role: str, pair: int | None, seed_index: int, seeds: int, pairs: int) -> int:
    """Where a run sits in the pilot's one array: per combination a block of k (1 + 2m) runs, the centre's k seeds
    first, then pair i's plus runs and minus runs (k each)."""
    block = seeds * (1 + 2 * pairs)
    if role == CENTRE:
        local = seed_index
    else:
        local = seeds + (2 * int(pair or 0) + (0 if role == PLUS else 1)) * seeds + seed_index
    return combination * block + local


def main_runs(plan: Mapping[str, Any]) -> int:
    """The runs of the pilot's combinations (k (1 + 2m) each); the horizon check's runs come after them."""
    return len(plan["combinations"]) * len(plan["seeds"]) * (1 + 2 * len(plan["directions"]))


def horizon_runs(plan: Mapping[str, Any]) -> int:
    """The horizon check's runs: the first combination's k (1 + 2m) inits and seeds again at train.steps (0 when the
    pilot's members train train.steps: nothing to check)."""
    return len(plan["seeds"]) * (1 + 2 * len(plan["directions"])) if plan.get("horizon") else 0


def horizon_index(role: str, pair: int | None, seed_index: int, seeds: int, pairs: int, main: int) -> int:
    """Where a horizon-check run sits: after the ``main`` runs, in the first combination's order."""
    return main + member_index(0, role, pair, seed_index, seeds, pairs)


def map_roles(pairs: int) -> list[tuple[str, int | None]]:
    """The maps of a combination in the plan's order: the centre, then pair i's plus and minus init."""
    return [(CENTRE, None)] + [(sign, i) for i in range(pairs) for sign in (PLUS, MINUS)]


# ------------------------------------------------------------------ statistics
def _centre_noise(values: Sequence[float], val_sizes: Sequence[int]) -> dict[str, Any]:
    """Seed noise of one init (the centre over its k seeds), split into the finite validation set's binomial part
    sqrt(p(1-p)/V) and the rest (training): total^2 = training^2 + binomial^2 if problem outcomes are independent."""
    n = len(values)
    out: dict[str, Any] = {"n": n, "values": list(values), "mean": statistics.fmean(values) if n else None,
                           "total_std": statistics.stdev(values) if n > 1 else None, "val_size": None,
                           "binomial_std": None, "training_std": None, "val_size_halving_binomial": None}
    if n and val_sizes:
        size = int(statistics.median(val_sizes))
        p = min(max(out["mean"], 0.0), 1.0)
        binomial = math.sqrt(p * (1.0 - p) / size) if size > 0 else None
        out.update(val_size=size, binomial_std=binomial, val_size_halving_binomial=4 * size)
        if out["total_std"] is not None and binomial is not None:
            out["training_std"] = math.sqrt(max(out["total_std"] ** 2 - binomial ** 2, 0.0))
    return out


def _pairs(plan: Mapping[str, Any], combination: int, records: Mapping[int, ResultRecord]) -> list[dict[str, Any]]:
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])
    out = []
    for i in range(pairs):
        diffs: list[float | None] = []
        for s in range(seeds):
            plus = records.get(member_index(combination, PLUS, i, s, seeds, pairs))
            minus = records.get(member_index(combination, MINUS, i, s, seeds, pairs))
            diffs.append(plus.fitness - minus.fitness if plus and minus and plus.ok and minus.ok else None)
        out.append(pair_row(i, diffs))
    return out


def _scale(plan: Mapping[str, Any], combination: int, records: Mapping[int, ResultRecord]) -> dict[str, Any]:
    """The scale effect: per seed, the mean fitness of the maps at the radius minus the centre's on that seed; its
    mean and t interval over the seeds where the centre and at least one perturbed init finished."""
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])
    diffs: list[float] = []
    for s in range(seeds):
        centre = records.get(member_index(combination, CENTRE, None, s, seeds, pairs))
        around = [records.get(member_index(combination, role, i, s, seeds, pairs))
                  for i in range(pairs) for role in (PLUS, MINUS)]
        values = [r.fitness for r in around if r is not None and r.ok]
        if centre is not None and centre.ok and values:
            diffs.append(statistics.fmean(values) - centre.fitness)
    interval = mean_interval(diffs)
    return {"n": len(diffs), "diffs": diffs, "mean": statistics.fmean(diffs) if diffs else None,
            "low": interval[0] if interval else None, "high": interval[1] if interval else None}


def what_a_search_buys(scale: Mapping[str, Any], direction: bool, radius: float) -> tuple[str, str]:
    """(``scale``, ``direction``, ``both`` or ``neither``, the advice that follows) from the scale effect's interval
    and the pairs' signal test."""
    up = scale["low"] is not None and scale["low"] > 0
    down = scale["high"] is not None and scale["high"] < 0
    gain = (f"{scale['mean']:+.4f} [{scale['low']:+.4f}, {scale['high']:+.4f}] over the centre" if
            scale["low"] is not None else "")
    if up and not direction:
        return "scale", (f"a search at radius {radius:g} would buy the scale: maps at that radius gain {gain} "
                         "whatever their direction, and the pairs show no direction to follow. Tune the coefficient "
                         "instead (divergence.coef, e.g. with meta.tune) or start from a map of that scale; a search "
                         "here would gain what its result table's radius_random row gains")
    if up:
        return "both", (f"a search at radius {radius:g} would buy both: the scale ({gain}, which any direction gives) "
                        "and a direction the pairs show. Search at this radius, and judge its gain against the "
                        "radius_random row of its result table, not against the start")
    if direction:
        extra = f" (the radius itself costs: {gain}; a smaller one may keep the direction)" if down else ""
        return "direction", (f"a search at radius {radius:g} would buy a direction: the pairs' differences exceed "
                             f"seed noise and the scale alone gives no resolved gain{extra}. Search at this radius")
    if down:
        return "neither", (f"at radius {radius:g} the maps lose {gain} and the pairs show no direction: try a smaller "
                           "radius")
    return "neither", (f"at radius {radius:g} neither a scale effect nor a direction is resolved at this pilot's size: "
                       "more pilot seeds or pairs, or another radius, before a search")


def _noise_split(combination_runs: Sequence[ResultRecord], noise_var: float | None) -> dict[str, Any]:
    """sigma_n^2 of a single-seed difference = training part + the binomial part 2 p(1-p)/V of two finite
    validations (p, V: all ok runs of the combination), the binomial part capped at sigma_n^2."""
    ok = [r for r in combination_runs if r.ok]
    if noise_var is None or not ok:
        return {"binomial_var": None, "training_var": None, "p": None, "val_size": None}
    p = min(max(statistics.fmean(r.fitness for r in ok), 0.0), 1.0)
    size = int(statistics.median(r.val_size for r in ok))
    binomial = min(2.0 * p * (1.0 - p) / size, noise_var) if size > 0 else None
    training = noise_var - binomial if binomial is not None else None
    return {"binomial_var": binomial, "training_var": training, "p": p, "val_size": size}


def _intermediate(indices: Sequence[int], records: Mapping[int, ResultRecord],
                  work_dirs: Mapping[int, str], ctx: PilotContext) -> dict[str, Any]:
    """Spearman correlation between the runs' intermediate scores at each step all of them reached and their final
    fitness: does an early look already rank inits as the end does?"""
    if ctx.eval_every is None:
        return {"measured": False, "reason": "not measured (train.eval_every is null)", "steps": []}
    series = {i: read_intermediate(work_dirs[i]) for i in indices if i in records and records[i].ok}
    series = {i: s for i, s in series.items() if s}
    if len(series) < 3:
        return {"measured": False, "steps": [],
                "reason": f"not measured: {len(series)} run(s) with intermediate scores (needs 3)"}
    common = sorted(set.intersection(*(set(s) for s in series.values())))
    steps = []
    for step in common:
        early = [series[i][step] for i in series]
        final = [records[i].fitness for i in series]
        steps.append({"step": step, "rho": spearman(early, final), "n": len(series)})
    return {"measured": True, "reason": None, "steps": steps}


def summarize_combination(plan: Mapping[str, Any], combination: int, records: Mapping[int, ResultRecord],
                          work_dirs: Mapping[int, str], ctx: PilotContext) -> dict[str, Any]:
    """One (radius, coef) combination's findings from its runs' records (absent: not final yet)."""
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])
    block = seeds * (1 + 2 * pairs)
    indices = list(range(combination * block, (combination + 1) * block))
    centre_indices = [member_index(combination, CENTRE, None, s, seeds, pairs) for s in range(seeds)]
    centre = [records.get(i) for i in centre_indices]
    ok_centre = [r for r in centre if r and r.ok]
    pair_rows = _pairs(plan, combination, records)
    snr = pair_snr(pair_rows, ctx.population, ctx.seeds_per_member)
    scale = _scale(plan, combination, records)
    buys, advice = what_a_search_buys(scale, snr["signal"], plan["combinations"][combination]["radius"])
    finals = [records[i] for i in indices if i in records]
    perturbed = [records[i].fitness for i in indices if i not in centre_indices and i in records and records[i].ok]
    return {
        "combination": combination, **plan["combinations"][combination],
        "runs": len(indices), "finished": len(finals), "failed": sum(1 for r in finals if not r.ok),
        "centre": _centre_noise([r.fitness for r in ok_centre], [r.val_size for r in ok_centre]),
        "perturbed_mean": statistics.fmean(perturbed) if perturbed else None,
        "pairs": pair_rows, **snr, "noise_split": _noise_split(finals, snr["noise_var"]),
        "scale": scale, "buys": buys, "advice": advice,
        "intermediate": _intermediate(indices, records, work_dirs, ctx),
        "truncation": _truncation(plan, combination, records, work_dirs, ctx),
    }


def _truncation_settings(truncation: Mapping[str, Any], ctx: PilotContext) -> TruncationSettings:
    """The truncation check's settings: the plan's T and horizon, the search's population, generations, target,
    es.stagger and step, and its member-steps (the searcher's own plan of its truncations)."""
    from meta.searchers import searcher_class
    from meta.searchers.nres import TRUNCATION_UPDATE

    es = ctx.es
    budget = searcher_class(str(es["name"])).planned_member_steps(es, ctx.population, ctx.generations) if es else None
    step = es.get(STEP_KEY)
    # a config without es.update: es=nres from before it, whose every truncation moved the centre
    per_truncation = es.get(UPDATE_KEY, TRUNCATION_UPDATE) == TRUNCATION_UPDATE
    return TruncationSettings(truncation_steps=int(truncation["steps"]), horizon=int(truncation["horizon"]),
                              population=ctx.population, generations=ctx.generations, target_snr=ctx.target_snr,
                              stagger=bool(es.get("stagger")), step=None if step is None else float(step),
                              per_truncation=per_truncation, budget_steps=budget)


def _truncation(plan: Mapping[str, Any], combination: int, records: Mapping[int, ResultRecord],
                work_dirs: Mapping[int, str], ctx: PilotContext) -> dict[str, Any] | None:
    """The truncation check of one combination (meta/pilot/truncation.py) from its pairs' scores every T steps
    (intermediate.jsonl) and at the end (the record); None for a pilot without one (es not online)."""
    truncation = plan.get("truncation")
    if not truncation:
        return None
    settings = _truncation_settings(truncation, ctx)
    bounds = boundaries(settings.horizon, settings.truncation_steps)
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])

    def scores(index: int) -> dict[int, float] | None:
        record = records.get(index)
        if record is None or not record.ok:
            return None
        return {**read_intermediate(work_dirs[index]), bounds[-1]: record.fitness}

    diffs: list[list[list[float] | None]] = []
    sizes = []
    for i in range(pairs):
        row: list[list[float] | None] = []
        for s in range(seeds):
            plus_index = member_index(combination, PLUS, i, s, seeds, pairs)
            minus_index = member_index(combination, MINUS, i, s, seeds, pairs)
            plus, minus = scores(plus_index), scores(minus_index)
            row.append(None if plus is None or minus is None else phase_differences(plus, minus, bounds))
            if row[-1] is not None:
                sizes += [records[plus_index].val_size, records[minus_index].val_size]
        diffs.append(row)
    return truncation_check(diffs, int(statistics.median(sizes)) if sizes else None, settings)


# ------------------------------------------------------------------ recommendation
def _hours(runs: float, member_hours: float, ctx: PilotContext) -> tuple[float, str]:
    """The cost of ``runs`` that run ``member_hours`` each (beside the members sharing their GPU): GPU time, else
    CPU time."""
    if ctx.gpus > 0:
        return gpu_time_h(runs * member_hours, ctx.gpus, ctx.sharing.members_per_gpu), "GPU-h"
    return runs * member_hours * ctx.cpus, "CPU-h"


def recommend(combinations: Sequence[Mapping[str, Any]], ctx: PilotContext, member_hours: float | None,
              pilot_member_hours: float) -> dict[str, Any]:
    """The combination with the highest SNR among those with signal, and the smallest even population (at the
    configured seeds per member), seeds per member and validation size (each at the configured population) that
    reach ctx.target_snr; SNR(P, r) = (P/2) u r with u = sigma_s^2 / sigma_n^2 per pair and seed."""
    spent, unit = _hours(1.0, pilot_member_hours, ctx)
    out: dict[str, Any] = {"target_snr": ctx.target_snr, "unit": unit, "pilot_hours": spent,
                           "member_hours": member_hours, "reachable": False}
    with_signal = [c for c in combinations if c["signal"]]
    if not with_signal:
        scale = [c for c in combinations if c.get("buys") == "scale"]
        out["reason"] = ("no combination shows signal: the members' differences are not distinguishable from seed "
                         "noise. " + ("The maps gain by their scale alone at radius "
                                      + ", ".join(f"{c['radius']:g}" for c in scale)
                                      + ": tune the coefficient there instead of searching" if scale else
                                      "A larger radius or divergence.coef, a larger validation set, or more pilot "
                                      "pairs may show one"))
        return out
    best = max(with_signal, key=lambda c: (c["noise_free"], c["snr"] or 0.0, -c["combination"]))
    r, pop, target = ctx.seeds_per_member, ctx.population, ctx.target_snr
    out.update(reachable=True, combination=best["combination"], radius=best["radius"], coef=best["coef"],
               snr=best["snr"], noise_free=best["noise_free"])
    if best["noise_free"]:  # no noise to beat: the smallest antithetic population sees the signal
        population, population_snr, seeds, val_size = 2, None, 1, None
    else:
        per_pair = best["signal_var"] / best["noise_var"]  # u: SNR of one pair on one seed
        population = 2 * max(1, ceil_int(target / (per_pair * r)))
        population_snr = population / 2.0 * per_pair * r
        seeds = max(1, ceil_int(target / (pop / 2.0 * per_pair)))
        val_size = _val_size(best, pop / 2.0 * best["signal_var"] * r / target)
    runs = population * ctx.generations * r
    hours = _hours(runs, member_hours, ctx)[0] if member_hours is not None else None
    out.update(population=population, population_snr=population_snr, seeds_per_member=seeds, val_size=val_size,
               search_runs=runs, search_hours=hours)
    return out


def _val_size(best: Mapping[str, Any], max_noise_var: float) -> dict[str, Any]:
    """The validation size at which sigma_n^2 (binomial part scaled by V/V') falls to ``max_noise_var``."""
    split = best["noise_split"]
    binomial, training, size = split["binomial_var"], split["training_var"], split["val_size"]
    if binomial is None or not size:
        return {"value": None, "reason": "validation size unknown"}
    if training >= max_noise_var:
        return {"value": None, "reason": "not reachable by the validation size alone: the training part of the "
                                         "noise already exceeds what the target allows"}
    if binomial <= 0.0:
        return {"value": None, "reason": "no binomial part to shrink"}
    return {"value": max(1, ceil_int(binomial * size / (max_noise_var - training))), "reason": None}


# ------------------------------------------------------------------ the run dir
def summarize_run_dir(run_dir: str | Path) -> dict[str, Any]:
    """The findings of every combination from the plan, config.yaml and the runs' result files; ValueError when the
    dir holds no pilot plan yet. ``complete`` says whether every run is final."""
    store = RunStore(run_dir)
    plan = store.read_pilot_plan()
    if plan is None:
        raise ValueError(f"{store.root} holds no pilot plan yet (killed before its first submission?)")
    ctx = pilot_context(stored_config(store))
    if plan.get("truncation") and ctx.eval_every is None:  # the truncation check's validations rank runs early too
        ctx = replace(ctx, eval_every=int(plan["truncation"]["steps"]))
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])
    main = main_runs(plan)
    total = main + horizon_runs(plan)
    work_dirs = {m["index"]: m["work_dir"] for m in plan["members"]}
    records: dict[int, ResultRecord] = {}
    for index in range(total):
        record = read_result(work_dirs[index])
        if record is not None:
            records[index] = record
    combinations = [summarize_combination(plan, j, records, work_dirs, ctx) for j in range(len(plan["combinations"]))]
    ok_hours = [r.wall_time_s / 3600.0 for i, r in records.items() if r.ok and i < main]  # a search member's time
    planned_h = ctx.sharing.member_time(ctx.member_time_min) / 60.0 if ctx.member_time_min else None
    manifest = stored_manifest(store)
    recommendation = recommend(combinations, ctx, statistics.fmean(ok_hours) if ok_hours else planned_h,
                               sum(r.wall_time_s for r in records.values()) / 3600.0)
    recommendation["nres"] = _nres(combinations, recommendation, ctx)
    return {
        "kind": PILOT_KIND, "significance": SIGNIFICANCE, "run_dir": str(store.root), "run_id": manifest.get("run_id"), "seed": plan["seed"],
        "complete": len(records) == total, "runs": total, "finished": len(records),
        "failed": sum(1 for r in records.values() if not r.ok),
        "seeds": seeds, "pairs": pairs, "radius_key": plan["radius_key"], "es": plan["es"],
        "population": ctx.population, "generations": ctx.generations, "seeds_per_member": ctx.seeds_per_member,
        "seeds_per_member_set": ctx.seeds_per_member_set, "eval_every": ctx.eval_every,
        "combinations": combinations, "horizon": _horizon(plan, records, ctx, main),
        "recommendation": recommendation,
    }


def _nres(combinations: Sequence[Mapping[str, Any]], rec: Mapping[str, Any],
          ctx: PilotContext) -> dict[str, Any] | None:
    """es=nres's recommendation at the combination the whole-run recommendation chose (its truncation check's),
    with its search's member-steps and cost; None for a pilot without a truncation check."""
    from meta.searchers import searcher_class

    if not any(c.get("truncation") for c in combinations):
        return None
    if not rec["reachable"]:
        return {"visible": False, "combination": None,
                "reason": "no combination shows signal in whole particle runs: nres cannot see anything either"}
    check = combinations[rec["combination"]]["truncation"]
    out: dict[str, Any] = {"combination": rec["combination"], **check["recommendation"], "search_truncations": None,
                           "search_member_steps": None, "search_hours": None}
    if out["population"] is None or out["truncation_steps"] is None:
        return out
    es = {**ctx.es, TRUNCATION_KEY: out["truncation_steps"]}
    steps = searcher_class(str(es["name"])).planned_member_steps(es, out["population"], ctx.generations)
    out.update(search_truncations=out["population"] * ctx.generations, search_member_steps=steps)
    if rec["member_hours"] is not None and steps is not None:  # the pilot's whole-run time per step + each start
        runs = _hours(steps / check["horizon"], rec["member_hours"], ctx)[0]
        starts = _hours(out["search_truncations"], ctx.short_run_overhead_min / 60.0, ctx)[0]
        out["search_hours"] = runs + starts
    return out


def _horizon(plan: Mapping[str, Any], records: Mapping[int, ResultRecord], ctx: PilotContext,
             main: int) -> dict[str, Any] | None:
    """The horizon check (meta/pilot/horizon.py) from the first combination's runs at es.member_steps and their
    twins at train.steps; None for a pilot whose members train train.steps."""
    horizon = plan.get("horizon")
    if not horizon:
        return None
    seeds, pairs = len(plan["seeds"]), len(plan["directions"])

    def fitness(index: int) -> float | None:
        record = records.get(index)
        return record.fitness if record is not None and record.ok else None

    roles = map_roles(pairs)
    short = [[fitness(member_index(0, role, pair, s, seeds, pairs)) for s in range(seeds)] for role, pair in roles]
    full = [[fitness(horizon_index(role, pair, s, seeds, pairs, main)) for s in range(seeds)] for role, pair in roles]
    finished = [records[i] for i in range(main, main + horizon_runs(plan)) if i in records]
    spent, unit = _hours(1.0, sum(r.wall_time_s for r in finished) / 3600.0, ctx)
    cost = {"runs": horizon_runs(plan), "cost_hours": spent, "cost_unit": unit,
            "cost_text": f"{num_text(spent, 3)} {unit} measured over the {len(finished)} final ones (their wall time x "
                         f"{'resources.gpus' if unit == 'GPU-h' else 'resources.cpus'})"}
    return horizon_check(short, full, int(horizon["member_steps"]), int(horizon["steps"]), int(plan["seed"]), cost)
