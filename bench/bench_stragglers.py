"""Straggler-tolerant generations: wall time per generation and busy fraction of the slots, quorum=1.0 (wait for
every member) side by side with a quorum, on population-180 synthetic members with heavy-tailed running times.

Part 1 (real runs): two `python -m meta.run` searches, launcher=local (every member its own process = its own
"GPU slot"), the synthetic objective (meta/synthetic.py) with log-normal member times (sigma 0.5) and 2% of the
members 5x slower, the same seed, so both arms see the same members and the same times. Printed per arm: wall per
generation, busy fraction (sum of the finished members' running times / (slots x generation wall)), late members,
the objective at the centre after each generation (ES progress), and the ratios.

Part 2 (the bias guard, simulated in-process with the real searcher and the real quorum rule, no processes): when a
member's time tracks its fitness, closing at the quorum leaves out a non-random set. From the same states, the step
with the quorum is compared with the step with every member (cosine), with time tracking fitness positively,
negatively and not at all, and the objective reached after G generations.

    .venv/bin/python bench/bench_stragglers.py --generations 3 --median-s 8 --quorum 0.9 --grace 0.5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.search.generation.generation_close import QuorumClock  # noqa: E402
from meta.search.generation.generation_shape import GenerationShape  # noqa: E402
from meta.search.init import initial_center  # noqa: E402
from meta.searchers import build_searcher  # noqa: E402
from meta.synthetic import member_time_s, objective  # noqa: E402
from core.records import MemberSpec, ResultRecord  # noqa: E402
from results.store.run_store import RunStore  # noqa: E402


def _options(opts: argparse.Namespace, tracks: float = 0.0) -> dict:
    return {"time_median_s": opts.median_s, "time_sigma": 0.5, "slow_fraction": 0.02, "slow_factor": 5.0,
            "time_tracks_fitness": tracks}


def _run_arm(run_dir: Path, opts: argparse.Namespace, quorum: float) -> float:
    options = ",".join(f"{k}:{v}" for k, v in _options(opts).items())
    command = [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "launcher=local", "seed=0",
               "inner.entrypoint=meta.synthetic:member", f"population={opts.population}",
               f"generations={opts.generations}", "control_member=false", "reevaluate.top_k=0",
               f"quorum={quorum}", f"straggler_grace={opts.grace}", "inner.timeout_s=3600", "retries=0",
               "log_level=WARNING", f"+inner.options={{{options}}}"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"arm quorum={quorum} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def _arm_figures(run_dir: Path, population: int) -> list[dict]:
    store = RunStore(run_dir)
    members, gens = store.read_members(), store.read_generations().set_index("generation")
    rows = []
    for generation in sorted(gens.index):
        group = members[members["generation"] == generation]
        finished = group[group["status"] == "ok"]
        wall = float(gens.loc[generation, "wall_time_s"])
        centre = store.read_state(generation)["center"]
        rows.append({
            "generation": int(generation), "wall_s": wall,
            "busy": float(finished["wall_time_s"].sum()) / (population * wall),
            "late": int((group["status"] == "late").sum()),
            "slowest_member_s": float(finished["wall_time_s"].max()),
            "objective_at_centre": objective(centre.tolist()),
        })
    return rows


def part_one(opts: argparse.Namespace) -> dict:
    arms = {"quorum=1.0 (baseline)": 1.0, f"quorum={opts.quorum}, grace={opts.grace}": opts.quorum}
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, quorum in arms.items():
            total = _run_arm(Path(tmp) / f"q{quorum}", opts, quorum)
            figures[name] = {"total_s": total, "rows": _arm_figures(Path(tmp) / f"q{quorum}", opts.population)}
    print(f"\nPart 1: population {opts.population}, {opts.generations} generations, member time log-normal "
          f"(median {opts.median_s:g} s, sigma 0.5) + 2% x5, launcher=local, es=pgpe")
    print(f"{'arm':32s} {'gen':>3s} {'wall s':>8s} {'slowest':>8s} {'busy':>6s} {'late':>5s} {'objective':>9s}")
    for name, data in figures.items():
        for row in data["rows"]:
            print(f"{name:32s} {row['generation']:3d} {row['wall_s']:8.1f} {row['slowest_member_s']:8.1f} "
                  f"{row['busy']:6.2f} {row['late']:5d} {row['objective_at_centre']:9.4f}")
    base, quick = (figures[n]["rows"] for n in arms)
    wall_ratio = statistics.fmean(r["wall_s"] for r in base) / statistics.fmean(r["wall_s"] for r in quick)
    print(f"wall per generation, baseline / quorum: {wall_ratio:.2f}x; busy fraction "
          f"{statistics.fmean(r['busy'] for r in base):.2f} -> {statistics.fmean(r['busy'] for r in quick):.2f}; "
          f"objective at the centre after {opts.generations} generations: {base[-1]['objective_at_centre']:.4f} "
          f"(baseline) vs {quick[-1]['objective_at_centre']:.4f}")
    return {"wall_ratio": wall_ratio, "figures": figures}


def _close(times: list[float], quorum: float, grace: float) -> list[bool]:
    """Which members the orchestrator's rule leaves late, replayed on known finishing times."""
    population = len(times)
    clock_now = [0.0]
    clock = QuorumClock(GenerationShape(population, quorum=quorum), grace, _now=lambda: clock_now[0])
    final: dict[int, ResultRecord] = {}
    for index in sorted(range(population), key=lambda i: times[i]):
        clock_now[0] = times[index]
        late = clock.late_members(final, [i for i in range(population) if i not in final])
        if late:
            return [i in late for i in range(population)]
        final[index] = ResultRecord(status="ok", fitness=0.0, wall_time_s=times[index])
    return [False] * population


def part_two(opts: argparse.Namespace) -> dict:
    print(f"\nPart 2: the quorum's bias when time tracks fitness (simulated: real pgpe, real QuorumClock, "
          f"population {opts.population}, {opts.bias_generations} generations, quorum {opts.quorum}, grace {opts.grace})")
    print(f"{'time_tracks_fitness':>20s} {'late/gen':>9s} {'cos(step, full step)':>21s} "
          f"{'objective full':>15s} {'objective quorum':>17s}")
    out = {}
    for tracks in (0.0, 20.0, -20.0):
        options = _options(opts, tracks)
        full = build_searcher({"name": "pgpe", "radius": 0.01}, initial_center("uniform", 0), opts.population, 0)
        quick = build_searcher({"name": "pgpe", "radius": 0.01}, initial_center("uniform", 0), opts.population, 0)
        cosines, lates = [], []
        for generation in range(opts.bias_generations):
            values = quick.ask(generation)
            fitness = torch.tensor([objective(v.tolist()) for v in values], dtype=torch.float64)
            specs = [MemberSpec("r", generation, i, 0, [], "") for i in range(opts.population)]
            times = [member_time_s(spec, options, float(f)) for spec, f in zip(specs, fitness)]
            late = torch.tensor(_close(times, opts.quorum, opts.grace))
            ok = torch.ones(opts.population, dtype=torch.bool)
            reference = build_searcher({"name": "pgpe", "radius": 0.01}, initial_center("uniform", 0), opts.population, 0)
            reference.load_state_dict(quick.state_dict())
            before = quick.center
            reference.tell(generation, values, fitness, ok)
            quick.tell(generation, values, fitness, ok, late)
            step_full, step_quick = reference.center - before, quick.center - before
            cosines.append(float(torch.nn.functional.cosine_similarity(step_full, step_quick, dim=0)))
            lates.append(int(late.sum()))
            full_values = full.ask(generation)
            full.tell(generation, full_values,
                      torch.tensor([objective(v.tolist()) for v in full_values], dtype=torch.float64), ok)
        out[tracks] = {"cos_mean": statistics.fmean(cosines), "cos_min": min(cosines), "late": statistics.fmean(lates),
                       "objective_full": objective(full.center.tolist()),
                       "objective_quorum": objective(quick.center.tolist())}
        row = out[tracks]
        print(f"{tracks:20g} {row['late']:9.1f} {row['cos_mean']:12.3f} (min {row['cos_min']:.3f}) "
              f"{row['objective_full']:15.4f} {row['objective_quorum']:17.4f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=180)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--median-s", type=float, default=8.0)
    parser.add_argument("--quorum", type=float, default=0.9)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--bias-generations", type=int, default=20)
    parser.add_argument("--skip-runs", action="store_true", help="part 2 only")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    opts = parser.parse_args()
    results = {} if opts.skip_runs else {"runs": part_one(opts)}
    results["bias"] = part_two(opts)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
