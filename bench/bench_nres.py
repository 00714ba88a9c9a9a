"""Equal-information comparison of whole runs, short members and es=nres on the family of unrolled problems.

The problems (meta/unrolled.py): rate_floor, opposed, plateau (pass@1 on 90 problems), many (96 coordinates with
curvatures over two decades). Members are simulated in-process with the real searchers (meta/searchers/): a whole-run
member trains ``--horizon`` steps with its vector and is scored at the end; a short member (es.member_steps=T) trains T
steps as a run of its own; an es=nres member continues its particle's run for one truncation from the state its
particle stands on (as the orchestrator and the synthetic member carry it through boundary checkpoints) and reports
the change of the measured score over it.

Three searches, each at its own best step from a small grid (best: fewest member-steps to stay within ``--tolerance``
of the full-horizon optimum, median over seeds):

  whole   pgpe (the default searcher), whole runs: information per member-step is the reference
  short   pgpe, members of T steps: cheaper, but biased toward the short horizon's optimum
  nres    es=nres (staggered and together), particles of ``--horizon`` steps in truncations of T

Printed: per problem, each search's member-steps and outer updates until the centre stays within the tolerance, and
es=nres at its defaults after 1, 2 and 3 episodes (centre and its Polyak average). Distances are the problems' own
(meta/unrolled.py ``distance``: |z - z*| for one-direction problems).

    .venv/bin/python bench/bench_nres.py --seeds 3
    .venv/bin/python bench/bench_nres.py --problems opposed --seeds 5 --defaults-only
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.searchers import build_searcher  # noqa: E402
from meta.searchers.nres import DEFAULT_PIECES, DEFAULT_STEP_RADII, RUN_UPDATE, UPDATES  # noqa: E402
from meta.searchers.pgpe import DEFAULT_STEP_RADII as PGPE_DEFAULT_STEP_RADII  # noqa: E402
from meta.unrolled import PROBLEMS, UnrolledProblem  # noqa: E402

logger = logging.getLogger("bench_nres")
RADIUS = 0.01


@dataclass
class Trace:
    """A search's centre after every outer update, with the member-steps spent by then."""

    distances: list[float] = field(default_factory=list)
    averaged: list[float] = field(default_factory=list)
    member_steps: list[int] = field(default_factory=list)

    def settled(self, tolerance: float) -> int | None:
        """The first update from which the centre stays within ``tolerance`` to the end; None: it never does."""
        index = None
        for i, distance in enumerate(self.distances):
            if distance <= tolerance:
                index = i if index is None else index
            else:
                index = None
        return index


def whole_runs(problem: UnrolledProblem, steps: int, horizon: int, population: int, generations: int, seed: int,
               step_radii: float) -> Trace:
    """pgpe (ClipUp's step ``step_radii`` radii), every member a run of ``steps`` steps scored at its end (measured as
    the problem measures)."""
    searcher = build_searcher({"name": "pgpe", "radius": RADIUS, "step_radii": step_radii},
                              torch.tensor(problem.start(), dtype=torch.float64), population, seed)
    trace = Trace()
    for generation in range(generations):
        values = searcher.ask(generation)
        fitness = []
        for index, row in enumerate(values.tolist()):
            state, features = problem.initial(), problem.features(row)
            for t in range(steps):
                state = problem.step(state, features, t, steps)
            fitness.append(problem.measure(state, f"whole:{seed}:{generation}:{index}"))
        searcher.tell(generation, values, torch.tensor(fitness, dtype=torch.float64),
                      torch.ones(population, dtype=torch.bool))
        trace.distances.append(problem.distance(searcher.center.tolist(), horizon))
        trace.member_steps.append(population * steps * (generation + 1))
    return trace


def particles(problem: UnrolledProblem, horizon: int, truncation: int, population: int, generations: int, seed: int,
              stagger: bool = True, step_radii: float = DEFAULT_STEP_RADII, update: str = RUN_UPDATE) -> Trace:
    """es=nres: each member continues its particle's run for one truncation and reports its measured change."""
    searcher = build_searcher({"name": "nres", "horizon_steps": horizon, "truncation_steps": truncation,
                               "radius": RADIUS, "stagger": stagger, "step_radii": step_radii, "update": update},
                              torch.tensor(problem.start(), dtype=torch.float64), population, seed)
    states: dict[tuple[int, int], object] = {}
    trace, spent = Trace(), 0
    for generation in range(generations):
        values = searcher.ask(generation)
        deltas = []
        for index, piece in enumerate(searcher.truncations() or []):
            key = (index, piece["episode"])
            state = problem.initial() if piece["start"] == 0 else states[key]
            before = problem.measure(state, f"p:{seed}:{index}:{piece['episode']}:{piece['start']}")
            features = problem.features(values[index].tolist())
            for t in range(piece["start"], piece["stop"]):
                state = problem.step(state, features, t, horizon)
            states[key] = state
            deltas.append(problem.measure(state, f"p:{seed}:{index}:{piece['episode']}:{piece['stop']}") - before)
            spent += piece["stop"] - piece["start"]
        searcher.tell(generation, values, torch.tensor(deltas, dtype=torch.float64),
                      torch.ones(population, dtype=torch.bool))
        trace.distances.append(problem.distance(searcher.center.tolist(), horizon))
        averaged = searcher.averaged_center
        trace.averaged.append(problem.distance((averaged if averaged is not None else searcher.center).tolist(),
                                               horizon))
        trace.member_steps.append(spent)
    return trace


def _median(values: Sequence[float | None]) -> float | None:
    """The median counting a search that never settled as worse than any that did (None when most never did)."""
    ordered = sorted(float("inf") if v is None else v for v in values)
    middle = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1]
                                                                  + ordered[len(ordered) // 2]) / 2
    return None if middle == float("inf") else middle


def _cost(traces: list[Trace], tolerance: float) -> tuple[float | None, float | None]:
    """Median (member-steps, outer updates) until each seed's centre stays within ``tolerance``."""
    settled = [t.settled(tolerance) for t in traces]
    steps = [None if s is None else t.member_steps[s] for s, t in zip(settled, traces)]
    updates = [None if s is None else s + 1 for s in settled]
    return _median(steps), _median(updates)


def _text(value: float | None) -> str:
    return "never" if value is None else f"{value:,.0f}"


def _best(label: str, grid: Sequence[float], search, tolerance: float) -> tuple[str, list[Trace]]:  # noqa: ANN001
    """The grid's step with the fewest median member-steps to settle (ties, or none settled: the nearest final)."""
    scored = []
    for step in grid:
        traces = search(step)
        cost = _cost(traces, tolerance)[0]
        final = statistics.median(t.distances[-1] for t in traces)
        scored.append(((float("inf") if cost is None else cost, final), step, traces))
    _, step, traces = min(scored, key=lambda item: item[0])
    return f"{label} {step:g}", traces


def defaults_table(problem: UnrolledProblem, horizon: int, truncation: int, population: int, pieces: int,
                   seeds: Sequence[int]) -> list[tuple[int, list[float], list[float], list[float]]]:
    """Per episode 1-3: es=nres at its defaults (centre, Polyak average) and whole runs at pgpe's default step with the
    same member-steps (one generation per episode), each seed's distance to the full-horizon optimum."""
    nres = [particles(problem, horizon, truncation, population, 3 * pieces, s) for s in seeds]
    whole = [whole_runs(problem, horizon, horizon, population, 3, s, PGPE_DEFAULT_STEP_RADII) for s in seeds]
    return [(episode, [t.distances[episode * pieces - 1] for t in nres], [t.averaged[episode * pieces - 1] for t in nres],
             [t.distances[episode - 1] for t in whole]) for episode in (1, 2, 3)]




def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", default=sorted(PROBLEMS), choices=sorted(PROBLEMS))
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--pieces", type=int, default=DEFAULT_PIECES, help="truncations per run (T = horizon/pieces)")
    parser.add_argument("--population", type=int, default=24)
    parser.add_argument("--episodes", type=int, default=6, help="the budget: this many runs per particle (member-"
                        "steps = population x horizon x episodes for every search)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.3, help="settled: within this share of the start's "
                        "distance to the full-horizon optimum, to the end of the budget")
    parser.add_argument("--pgpe-steps", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0],
                        help="pgpe's es.step_radii grid")
    parser.add_argument("--nres-steps", type=float, nargs="+", default=[0.75, 1.5, 3.0])
    parser.add_argument("--defaults-only", action="store_true", help="only es=nres at its defaults")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    torch.set_num_threads(1)  # tiny tensors: a thread pool only adds its synchronisation
    horizon, truncation = args.horizon, max(1, args.horizon // args.pieces)
    seeds = list(range(args.seeds))
    for name in args.problems:
        problem = PROBLEMS[name]()
        start = problem.distance(problem.start(), horizon)
        tolerance = args.tolerance * start
        logger.info("\n== %s: start %.2f from the full-horizon optimum; population %d, H %d, T %d; %d seeds", name,
                    start, args.population, horizon, truncation, args.seeds)
        logger.info("es=nres at its defaults (step %.2g radii, %s update, staggered) against whole runs at pgpe's "
                    "default step with the same member-steps: distance after each episode, per seed", DEFAULT_STEP_RADII,
                    RUN_UPDATE)
        for episode, centre, averaged, whole in defaults_table(problem, horizon, truncation, args.population,
                                                               args.pieces, seeds):
            logger.info("  episode %d: nres %s   Polyak %s   whole runs %s", episode,
                        " ".join(f"{d:.2f}" for d in centre), " ".join(f"{d:.2f}" for d in averaged),
                        " ".join(f"{d:.2f}" for d in whole))
        if args.defaults_only:
            continue
        logger.info("each at its best step (budget %d episodes = %s member-steps; settled: within %.2f to the end)",
                    args.episodes, f"{args.population * horizon * args.episodes:,}", tolerance)
        logger.info("%-40s %14s %9s %10s", "search, best step", "member-steps", "updates", "final dist")
        rows = [
            _best("whole runs (pgpe), radii", args.pgpe_steps, lambda lr: [
                whole_runs(problem, horizon, horizon, args.population, args.episodes, s, lr) for s in seeds],
                tolerance),
            _best("short members T (pgpe), radii", args.pgpe_steps, lambda lr: [
                whole_runs(problem, truncation, horizon, args.population, args.episodes * args.pieces, s, lr)
                for s in seeds], tolerance),
        ]
        for update in UPDATES:
            for stagger in (True, False):
                rows.append(_best(f"nres {update} {'staggered' if stagger else 'together'}, radii", args.nres_steps,
                                  lambda step, u=update, st=stagger: [
                                      particles(problem, horizon, truncation, args.population,
                                                args.episodes * args.pieces, s, st, step, u) for s in seeds],
                                  tolerance))
        for label, traces in rows:
            steps_needed, updates = _cost(traces, tolerance)
            final = statistics.median(t.distances[-1] for t in traces)
            logger.info("%-40s %14s %9s %10.2f", label, _text(steps_needed), _text(updates), final)


if __name__ == "__main__":
    main()
