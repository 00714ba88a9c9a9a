"""Short-horizon bias and es=nres on the synthetic unrolled problem (meta/synthetic.py ``unrolled``), in-process.

The problem: a vector sets a rate r; a run of n steps takes the loss from 1 through L <- (1 - r)^2 L + r^2 floor, the
score is 1 - L. Over a few steps a large rate wins, over many a small one, so the best logit z* (of r) at the
truncation length differs from the best at the full horizon (``unrolled_optimum``). Three searches from the same
centre and seed, with the real searchers (meta/searchers/) and members simulated in-process (each particle's loss
carried from truncation to truncation, as the orchestrator and the synthetic member carry it through the particle's
boundary checkpoints):

  full    pgpe, every member a whole run of ``--horizon`` steps (today's search)
  short   pgpe, every member ``--truncation`` steps (a short member horizon, es.member_steps=T)
  nres    es=nres, particles of ``--horizon`` steps cut into truncations of ``--truncation``, staggered and together

Printed per search and seed: the centre's final z against both optima, and member-steps, with their ratio to full.

    .venv/bin/python bench/bench_nres.py --seeds 3 --generations 24 48 60 72
    .venv/bin/python bench/bench_nres.py --seeds 3 --generations 48 96 --optimizer clipup
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.searchers import build_searcher  # noqa: E402
from meta.synthetic import slope_direction, unrolled_loss, unrolled_optimum, unrolled_rate  # noqa: E402

DIM = 380
SCALE, TARGET, FLOOR = 30.0, 0.02, 0.5
#: the starting logit: above both optima, so both searches must move the same way first
Z0 = 0.5


@dataclass(frozen=True)
class Outcome:
    z: float
    member_steps: int


def logit(center: torch.Tensor) -> float:
    """z = scale * w.(x - target): the coordinate of the vector that sets the rate."""
    w = torch.tensor(slope_direction(DIM), dtype=torch.float64)
    return SCALE * float(w @ (center - TARGET))


def start_center() -> torch.Tensor:
    w = torch.tensor(slope_direction(DIM), dtype=torch.float64)
    return torch.full((DIM,), TARGET, dtype=torch.float64) + w * (Z0 / SCALE)


def whole_runs(steps: int, population: int, generations: int, seed: int, learning_rate: float = 0.02) -> Outcome:
    """pgpe (the default searcher), each member a whole run of ``steps`` steps scored at its end."""
    searcher = build_searcher({"name": "pgpe", "radius": 0.01, "center_learning_rate": learning_rate},
                              start_center(), population, seed)
    for generation in range(generations):
        values = searcher.ask(generation)
        fitness = [1.0 - unrolled_loss(unrolled_rate(v.tolist(), SCALE, TARGET), steps, FLOOR) for v in values]
        searcher.tell(generation, values, torch.tensor(fitness, dtype=torch.float64),
                      torch.ones(population, dtype=torch.bool))
    return Outcome(logit(searcher.center), population * generations * steps)


def particles(horizon: int, truncation: int, population: int, generations: int, seed: int, stagger: bool,
              learning_rate: float = 0.02, optimizer: str = "adam") -> Outcome:
    """es=nres: each member continues its particle's run for one truncation and reports its change of score."""
    searcher = build_searcher({"name": "nres", "horizon_steps": horizon, "truncation_steps": truncation,
                               "radius": 0.01, "stagger": stagger, "optimizer": optimizer,
                               "center_learning_rate": learning_rate}, start_center(), population, seed)
    loss: dict[tuple[int, int], float] = {}
    steps = 0
    for generation in range(generations):
        values = searcher.ask(generation)
        deltas = []
        for index, piece in enumerate(searcher.truncations() or []):
            key = (index, piece["episode"])
            before = 1.0 if piece["start"] == 0 else loss[key]
            rate = unrolled_rate(values[index].tolist(), SCALE, TARGET)
            loss[key] = unrolled_loss(rate, piece["stop"] - piece["start"], FLOOR, before)
            deltas.append(before - loss[key])  # the score's change over the truncation
            steps += piece["stop"] - piece["start"]
        searcher.tell(generation, values, torch.tensor(deltas, dtype=torch.float64),
                      torch.ones(population, dtype=torch.bool))
    return Outcome(logit(searcher.center), steps)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--horizon", type=int, default=48)
    parser.add_argument("--truncation", type=int, default=4)
    parser.add_argument("--population", type=int, default=48)
    parser.add_argument("--full-generations", type=int, default=24)
    parser.add_argument("--generations", type=int, nargs="+", default=[24, 48, 72, 96])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--optimizer", default="adam", help="es=nres's optimizer (adam, clipup, sgd)")
    parser.add_argument("--learning-rate", type=float, default=0.02, help="es=nres's center_learning_rate")
    args = parser.parse_args(argv)
    z_short, z_full = unrolled_optimum(args.truncation, FLOOR), unrolled_optimum(args.horizon, FLOOR)
    print(f"optima: z*(T={args.truncation}) = {z_short:.2f}, z*(H={args.horizon}) = {z_full:.2f}; start z = {Z0}; "
          f"population {args.population}")
    seeds = range(args.seeds)
    full = [whole_runs(args.horizon, args.population, args.full_generations, s) for s in seeds]
    short = [whole_runs(args.truncation, args.population, args.full_generations, s) for s in seeds]
    base = full[0].member_steps
    print(f"{'search':<24} {'gens':>5} {'final z per seed':<26} {'|z - z*H|':>9} {'|z - z*T|':>9} "
          f"{'member-steps':>12} {'vs full':>8}")

    def row(name: str, generations: int, outcomes: list[Outcome]) -> None:
        zs = [o.z for o in outcomes]
        print(f"{name:<24} {generations:>5} {', '.join(f'{z:.2f}' for z in zs):<26} "
              f"{statistics.mean(abs(z - z_full) for z in zs):>9.2f} {statistics.mean(abs(z - z_short) for z in zs):>9.2f} "
              f"{outcomes[0].member_steps:>12,} {outcomes[0].member_steps / base:>8.3f}")

    row("full (pgpe, H steps)", args.full_generations, full)
    row("short (pgpe, T steps)", args.full_generations, short)
    for generations in args.generations:
        for stagger in (True, False):
            outcomes = [particles(args.horizon, args.truncation, args.population, generations, s, stagger,
                                  args.learning_rate, args.optimizer) for s in seeds]
            row(f"nres {args.optimizer} {'staggered' if stagger else 'together'}", generations, outcomes)


if __name__ == "__main__":
    main()
