"""Three searches of the embedded default at one wall-clock budget: today's (every member a whole run of train.steps),
es.member_steps=T (short members), and es=nres (particles of train.steps cut into truncations of T).

Each arm is `python -m meta.run` on the embedded default (tiny model, arith, CPU), launcher=debug, as many generations
as fit in ``--budget-s`` seconds of its own (killed at the budget: the search resumes exactly from its latest state, so
its centre after the last finished generation is what it would export with which=center). Then every arm's centre,
the start and the result table's radius_random maps (meta/search/after/baselines.py: what one step of the search's size gives
by itself) are trained for train.steps on ``--seeds`` fresh seeds, the same seeds for all, and scored on validation.

Printed: per arm, member-steps per outer update, outer updates done and per hour, and validation pass@1 of its centre
(mean, and paired differences against the start and the radius_random maps, with standard errors).

    .venv/bin/python bench/bench_horizon.py --budget-s 150 --seeds 6
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.search.after.baselines import radius_random_vectors  # noqa: E402
from meta.compose import compose  # noqa: E402
from meta.search.config import build_search_config, search_center  # noqa: E402
from core.seeding import member_seed  # noqa: E402
from core.records import MemberSpec  # noqa: E402
from results.store.run_store import RunStore  # noqa: E402


def run_arm(run_dir: Path, overrides: list[str], budget_s: float) -> tuple[int, float]:
    """Run a search until ``budget_s`` has passed (then kill its process group); (generations done, seconds)."""
    command = [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "launcher=debug",
               "generations=10000", "reevaluate.top_k=0", "log_level=WARNING", *overrides]
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return len(RunStore(run_dir).state_generations()), time.monotonic() - started


def score(params: list[float], seeds: list[int], work: Path, inner: dict) -> list[float]:
    """Validation pass@1 of ``params`` trained for train.steps on each seed (the member entry point, in-process)."""
    from inner_loop.member.entry import train_member

    scores = []
    for k, seed in enumerate(seeds):
        spec = MemberSpec(run_id="bench", generation=0, index=k, seed=seed, params=list(params),
                          work_dir=str(work / f"seed{k}"), inner=inner)
        record = train_member(spec)
        if not record.ok:
            raise RuntimeError(f"{work}: {record.error}")
        scores.append(record.fitness)
    return scores


def mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):+.4f} +- {se:.4f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--truncation", type=int, default=None, help="T (default: train.steps / 16 rounded up)")
    args = parser.parse_args(argv)
    raw = compose([])
    cfg = build_search_config(raw)
    steps = cfg.full_steps
    t = args.truncation or math.ceil(steps / 16)
    arms = {"today (whole runs)": [], f"member_steps={t}": [f"es.member_steps={t}"],
            f"nres (T={t})": ["es=nres", f"es.truncation_steps={t}"]}
    per_update = {"today (whole runs)": (cfg.population + 1) * steps, f"member_steps={t}": (cfg.population + 1) * t,
                  f"nres (T={t})": cfg.population * t}
    seeds = [member_seed(cfg.seed, "bench_horizon", k) for k in range(args.seeds)]
    inner = cfg.member_inner()
    with tempfile.TemporaryDirectory(prefix="bench_horizon_") as tmp:
        root = Path(tmp)
        centres, done = {}, {}
        for name, overrides in arms.items():
            run_dir = root / name.split()[0].replace("=", "_")
            generations, wall = run_arm(run_dir, overrides, args.budget_s)
            latest = RunStore(run_dir).latest_state()
            centres[name] = (latest[1]["center"] if latest else search_center(cfg)).tolist()
            done[name] = (generations, wall)
            print(f"{name}: {generations} outer updates in {wall:.0f} s", flush=True)
        start = score(search_center(cfg).tolist(), seeds, root / "eval_start", inner)
        randoms = radius_random_vectors(cfg, len(seeds))
        radius = [score(v, [s], root / f"eval_radius{k}", inner)[0] for k, (v, s) in enumerate(zip(randoms, seeds))]
        print(f"\nembedded default: population {cfg.population}, train.steps={steps}, T={t}, budget {args.budget_s:g} s "
              f"per arm, {len(seeds)} fresh seeds")
        print(f"{'arm':<22} {'member-steps/update':>19} {'updates':>7} {'updates/h':>9}  {'pass@1':<18} "
              f"{'vs start':<18} {'vs radius_random':<18}")
        print(f"{'start':<22} {'':>19} {'':>7} {'':>9}  {mean_se(start):<18}")
        print(f"{'radius_random':<22} {'':>19} {'':>7} {'':>9}  {mean_se(radius):<18}")
        for name in arms:
            got = score(centres[name], seeds, root / f"eval_{name.split()[0]}", inner)
            generations, wall = done[name]
            print(f"{name:<22} {per_update[name]:>19} {generations:>7} {generations / wall * 3600:>9.0f}  "
                  f"{mean_se(got):<18} {mean_se([a - b for a, b in zip(got, start)]):<18} "
                  f"{mean_se([a - b for a, b in zip(got, radius)]):<18}", flush=True)


if __name__ == "__main__":
    main()
