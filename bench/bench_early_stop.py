"""early_stop: member-seconds per generation and ES progress with and without it, side by side, and its bias.

Part 1 (real runs): two `python -m meta.run` searches, es=snes, launcher=local (every member its own process), the
synthetic objective (meta/synthetic.py) with intermediate scores blurred by --early-noise and written at their
step's share of each member's running time, the same seed, early_stop off and on. Printed per arm: member-seconds
per generation (the members' recorded running times; a stopped member counts the time until its decision), the
stopped members, and the objective at the centre after each generation (ES progress); then the ratios.

Part 2 (the bias study, in-process with the real searcher and the real early_stop rule, no processes): from the same
states, the update with stopped members at the bottom is compared with the update from every member's final score
(cosine), at each margin, over G generations x R repeats; and the objective after G generations with and without.
The early scores are the final ones plus Gaussian noise calibrated to --early-corr, the within-population correlation
of early and final scores measured on the embedded default (docs/early_stop.md); the rule's noise is that blur's
standard deviation (what the pilot's seed spread of an early score estimates) unless --early-noise-rule is given. Printed: per margin, the false-cut rate
with its 95% interval, the saving of member time with its 95% interval, the mean/min cosine, and the objective
after G generations; and the saving at the smallest margin whose false-cut rate stays under 10%.

Part 3 (--embedded, minutes): one generation of the embedded default (real training runs of the tiny model) with
early_stop off and on, the same seed: member-seconds, the members stopped, and the cosine between the two updates.

    .venv/bin/python bench/bench_early_stop.py --population 32 --generations 3 --median-s 6
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.pilot.early_cuts import rule_stops, weighed_members  # noqa: E402
from meta.search.generation.early_stop import update_fitness  # noqa: E402
from meta.search.init import initial_center  # noqa: E402
from meta.searchers import build_searcher  # noqa: E402
from meta.synthetic import objective  # noqa: E402
from core.records import STOPPED_EARLY  # noqa: E402
from results.store.run_store import RunStore  # noqa: E402

ES = {"name": "snes", "radius": 0.01, "center_learning_rate": 1.0, "stdev_learning_rate": None,
      "ranking_method": "nes"}
#: the presets' searcher (conf/es/pgpe.yaml), whose update early_stop cannot leave unchanged: what moving to snes costs
PGPE = {"name": "pgpe", "center_learning_rate": 0.005, "stdev_learning_rate": 0.1, "radius": 0.01,
        "stdev_max_change": 0.2, "ranking_method": "centered", "optimizer": "clipup"}
STEPS, EVERY = 60, 10


def _run_arm(run_dir: Path, opts: argparse.Namespace, early: bool) -> float:
    options = (f"{{intermediate_noise:{opts.early_noise},time_median_s:{opts.median_s},time_sigma:0.3,"
               f"noise:{opts.seed_noise}}}")
    command = [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "launcher=local",
               f"launcher.array_parallelism={opts.population}", "seed=0", "es=snes", "es.radius=0.01",
               "inner.entrypoint=meta.synthetic:member", f"population={opts.population}",
               f"generations={opts.generations}", "control_member=false", "reevaluate.top_k=0",
               f"train.steps={STEPS}", f"train.eval_every={EVERY}", f"+inner.options={options}", "log_level=WARNING"]
    if early:
        rule_noise = opts.early_noise_rule if opts.early_noise_rule is not None else opts.early_noise
        command += ["early_stop.enabled=true", f"early_stop.at_fraction={opts.fraction}",
                    f"early_stop.noise={rule_noise}", f"early_stop.margin={opts.margin}"]
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, check=True)
    return time.monotonic() - started


def _member_seconds(group: "pd.DataFrame", fraction: float) -> tuple[float, int]:
    """(member-seconds, members stopped) of one generation's rows: a stopped member ran until its decision, that
    share of a full run's (median) time."""
    ok = group[group["status"] == "ok"]
    stopped = int((group["status"] == STOPPED_EARLY).sum())
    return float(ok["wall_time_s"].sum()) + stopped * float(ok["wall_time_s"].median()) * fraction, stopped


def _arm_figures(run_dir: Path, opts: argparse.Namespace) -> list[dict]:
    store = RunStore(run_dir)
    members = store.read_members()
    rows = []
    for generation in range(opts.generations):
        used, stopped = _member_seconds(members[members["generation"] == generation], opts.fraction)
        center = store.read_state(generation)["center"]
        rows.append({"generation": generation, "member_s": used, "stopped": stopped,
                     "objective": objective(center.tolist())})
    return rows


def part_one(opts: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        walls = {arm: _run_arm(Path(tmp) / arm, opts, arm == "early") for arm in ("full", "early")}
        figures = {arm: _arm_figures(Path(tmp) / arm, opts) for arm in walls}
    for arm, rows in figures.items():
        print(f"[{arm}] wall {walls[arm]:.1f} s")
        for row in rows:
            print(f"  gen {row['generation']}: member-seconds {row['member_s']:.1f}, stopped {row['stopped']}, "
                  f"objective at the centre {row['objective']:.4f}")
    full = sum(r["member_s"] for r in figures["full"])
    early = sum(r["member_s"] for r in figures["early"])
    print(f"member-seconds full / early_stop: {full:.1f} / {early:.1f} = {full / early:.2f}x; objective after "
          f"{opts.generations} generations: {figures['full'][-1]['objective']:.4f} vs {figures['early'][-1]['objective']:.4f}")
    return {"walls": walls, "figures": figures}


def part_embedded(opts: argparse.Namespace) -> dict:
    """The embedded default (the tiny model on arith, real training runs), es=snes, one generation each way from
    the same seed: member-seconds, members stopped, and the cosine between the two arms' centre moves (1.0: the
    update early_stop made is the full one)."""
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("full", "early"):
            run_dir = Path(tmp) / arm
            command = [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "es=snes",
                       f"population={opts.embedded_population}", "generations=1", "control_member=false",
                       "reevaluate.top_k=0", "train.eval_every=5", "log_level=WARNING"]
            if arm == "early":
                command += ["early_stop.enabled=true", f"early_stop.at_fraction={opts.fraction}",
                            f"early_stop.noise={opts.embedded_noise}", f"early_stop.margin={opts.margin}"]
            started = time.monotonic()
            subprocess.run(command, cwd=ROOT, check=True)
            wall = time.monotonic() - started
            store = RunStore(run_dir)
            members = store.read_members()
            used, stopped = _member_seconds(members, opts.fraction)
            start = initial_center("uniform", 0).to(torch.float64)
            figures[arm] = {"wall_s": wall, "member_s": used, "stopped": stopped,
                            "mean_fitness_ok": float(members[members["status"] == "ok"]["fitness"].mean()),
                            "move": store.read_state(0)["center"].to(torch.float64) - start}
    a, b = figures["full"]["move"], figures["early"]["move"]
    cosine = float(a @ b / (a.norm() * b.norm()))
    for arm, f in figures.items():
        print(f"[embedded {arm}] wall {f['wall_s']:.1f} s, member-seconds {f['member_s']:.1f}, stopped {f['stopped']}, "
              f"mean pass@1 of the members that ran to the end {f['mean_fitness_ok']:.4f}")
    print(f"embedded default: member-seconds full / early_stop = {figures['full']['member_s']:.1f} / "
          f"{figures['early']['member_s']:.1f} = {figures['full']['member_s'] / figures['early']['member_s']:.2f}x; "
          f"cosine between the two centre moves {cosine:.3f}")
    return {arm: {k: v for k, v in f.items() if k != "move"} for arm, f in figures.items()} | {"cosine": cosine}


def _population(searcher, generation: int, rng: random.Random, opts: argparse.Namespace):
    values = searcher.ask(generation)
    final = [objective(row.tolist()) + rng.gauss(0.0, opts.seed_noise) for row in values]
    spread = statistics.pstdev(final) or 1e-12
    # early = final + noise with corr(early, final) = early_corr within the population
    blur = spread * math.sqrt(max(1.0 / opts.early_corr ** 2 - 1.0, 0.0))
    early = [f + rng.gauss(0.0, blur) for f in final]
    return values, final, early, blur


def part_two(opts: argparse.Namespace) -> dict:
    """The bias study (see the module docstring)."""
    n = opts.population
    step = round(opts.fraction * STEPS)
    results = {}
    for margin in opts.margins:
        false_cuts = weighed = 0
        savings, cosines, objectives_full, objectives_early = [], [], [], []
        for repeat in range(opts.repeats):
            rng = random.Random(f"bench-early-stop:{repeat}")
            center = initial_center("uniform", repeat).to(torch.float64)
            full = build_searcher(ES, center, n, repeat)
            early = build_searcher(ES, center, n, repeat)
            for generation in range(opts.generations):
                state = full.state_dict()
                values, final, early_scores, blur = _population(full, generation, rng, opts)
                noise = opts.early_noise_rule if opts.early_noise_rule is not None else max(blur, 1e-12)
                stopped = rule_stops(early_scores, step, margin, noise)
                top = weighed_members(final)
                false_cuts += sum(1 for i in top if stopped[i])
                weighed += len(top)
                savings.append(sum(stopped) / n * (1.0 - opts.fraction))
                ok = torch.ones(n, dtype=torch.bool)
                probe = build_searcher(ES, center, n, repeat)
                probe.load_state_dict(state)
                probe.tell(generation, values, torch.tensor(update_fitness(final, stopped), dtype=torch.float64), ok)
                before = state["mu"]
                full.tell(generation, values, torch.tensor(final, dtype=torch.float64), ok)
                a, b = full.center - before, probe.center - before
                cosines.append(float(a @ b / (a.norm() * b.norm())) if float(a.norm() * b.norm()) > 0 else 1.0)
                # the search that really stops: its own states, its own populations
                e_values, e_final, e_early, e_blur = _population(early, generation, rng, opts)
                e_noise = opts.early_noise_rule if opts.early_noise_rule is not None else max(e_blur, 1e-12)
                e_stopped = rule_stops(e_early, step, margin, e_noise)
                early.tell(generation, e_values, torch.tensor(update_fitness(e_final, e_stopped),
                                                              dtype=torch.float64), ok)
            objectives_full.append(objective(full.center.tolist()))
            objectives_early.append(objective(early.center.tolist()))
        from scipy.stats import binomtest, t

        ci = binomtest(false_cuts, weighed).proportion_ci(method="exact") if weighed else None
        mean_saving = statistics.fmean(savings)
        half = t.ppf(0.975, len(savings) - 1) * statistics.stdev(savings) / math.sqrt(len(savings))
        results[margin] = {
            "false_cut": false_cuts / weighed, "false_cut_ci": (ci.low, ci.high) if ci else None,
            "saving": mean_saving, "saving_ci": (mean_saving - half, mean_saving + half),
            "speedup": 1.0 / (1.0 - mean_saving), "cosine_mean": statistics.fmean(cosines), "cosine_min": min(cosines),
            "objective_full": statistics.fmean(objectives_full), "objective_early": statistics.fmean(objectives_early),
        }
        r = results[margin]
        print(f"margin {margin:g}: false cuts {r['false_cut']:.3f} [{r['false_cut_ci'][0]:.3f}, "
              f"{r['false_cut_ci'][1]:.3f}] of {weighed} weighed | member time saved {r['saving']:.3f} "
              f"[{r['saving_ci'][0]:.3f}, {r['saving_ci'][1]:.3f}] ({r['speedup']:.2f}x fewer member-seconds) | "
              f"cosine to the full update mean {r['cosine_mean']:.3f}, min {r['cosine_min']:.3f} | objective after "
              f"{opts.generations} generations {r['objective_full']:.4f} full, {r['objective_early']:.4f} early_stop")
    pgpe = []
    for repeat in range(opts.repeats):
        rng = random.Random(f"bench-early-stop-pgpe:{repeat}")
        searcher = build_searcher(PGPE, initial_center("uniform", repeat).to(torch.float64), n, repeat)
        for generation in range(opts.generations):
            values, final, _, _ = _population(searcher, generation, rng, opts)
            searcher.tell(generation, values, torch.tensor(final, dtype=torch.float64), torch.ones(n, dtype=torch.bool))
        pgpe.append(objective(searcher.center.tolist()))
    snes = results[opts.margins[0]]["objective_full"]
    print(f"presets' searcher: pgpe (every member runs) reaches {statistics.fmean(pgpe):.4f} after {opts.generations} "
          f"generations, snes (every member runs) {snes:.4f}: moving to snes changes ES progress by "
          f"{snes - statistics.fmean(pgpe):+.4f} here")
    results["pgpe_objective"] = statistics.fmean(pgpe)
    safe = [m for m in opts.margins if results[m]["false_cut_ci"] and results[m]["false_cut"] < 0.10]
    if safe:
        m = min(safe)
        r = results[m]
        print(f"smallest margin with false cuts under 10%: {m:g}: saving {r['saving']:.3f} "
              f"[{r['saving_ci'][0]:.3f}, {r['saving_ci'][1]:.3f}] of member time = {r['speedup']:.2f}x, cosine "
              f"{r['cosine_mean']:.3f}")
    else:
        print("no margin kept the false cuts under 10%")
    return {str(k): v for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--median-s", type=float, default=6.0, help="part 1: a member's median running time")
    parser.add_argument("--fraction", type=float, default=1 / 3, help="early_stop.at_fraction")
    parser.add_argument("--margin", type=float, default=1.0, help="part 1's early_stop.margin")
    parser.add_argument("--margins", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0], help="part 2's margins")
    parser.add_argument("--early-corr", type=float, default=0.5,
                        help="part 2: within-population correlation of early and final scores (measured)")
    parser.add_argument("--early-noise", type=float, default=0.01, help="part 1: std of the synthetic early blur")
    parser.add_argument("--early-noise-rule", type=float, default=None,
                        help="early_stop.noise (part 2 default: the early scores' own noise, as the pilot measures it)")
    parser.add_argument("--seed-noise", type=float, default=0.0, help="seed noise of the final fitness")
    parser.add_argument("--repeats", type=int, default=20, help="part 2: independent searches per margin")
    parser.add_argument("--skip-real", action="store_true", help="part 2 only")
    parser.add_argument("--embedded", action="store_true",
                        help="also one generation of the embedded default each way (real training runs, minutes)")
    parser.add_argument("--embedded-population", type=int, default=8)
    parser.add_argument("--embedded-noise", type=float, default=0.084,
                        help="early_stop.noise for the embedded default (the pilot's measured early-score seed std)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    opts = parser.parse_args()
    out = {}
    if not opts.skip_real:
        print("== part 1: real runs (synthetic members, launcher=local), early_stop off vs on ==")
        out["part_one"] = part_one(opts)
    print("== part 2: bias study (real searcher and rule, in-process) ==")
    out["part_two"] = part_two(opts)
    if opts.embedded:
        print("== part 3: the embedded default, early_stop off vs on ==")
        out["embedded"] = part_embedded(opts)
    if opts.json:
        opts.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
