"""Per-generation overhead of the orchestrator vs a bare submitit ``map_array``, side by side.

Run: .venv/bin/python bench/bench_orchestrator.py [--population 180] [--sleep 10] [--repeats 1]

Both sides run the same light members (meta.synthetic:member sleeping a fixed time; no torch in the member
process) through submitit's LocalExecutor, one process per member, no parallelism limit on either side.
  baseline:     executor.map_array(member, specs) then job.result() for every job;
  orchestrator: Orchestrator.run_generation (ask, population file, submit, jobs.json, polling result files,
                tell, tables, checksummed state) with the local launcher.
Overhead = generation wall time minus the slowest member's own wall time. The sides alternate
(baseline first) so background load hits both alike; the ratio is printed per repeat.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meta.synthetic import member as synthetic_member  # noqa: E402
from results.store.layout import LAUNCHER_DIR, member_dir_name  # noqa: E402


def member_specs(folder: Path, population: int, sleep_s: float) -> list[dict]:
    return [
        {"run_id": "bench", "generation": 0, "index": i, "seed": 0, "params": [0.005] * 380,
         "work_dir": str(folder / member_dir_name(i)), "inner": {"options": {"sleep_s": sleep_s}}}
        for i in range(population)
    ]


def run_baseline(folder: Path, population: int, sleep_s: float) -> tuple[float, float]:
    import submitit

    specs = member_specs(folder, population, sleep_s)
    start = time.monotonic()
    executor = submitit.LocalExecutor(folder=folder / LAUNCHER_DIR)
    executor.update_parameters(timeout_min=30)
    jobs = executor.map_array(synthetic_member, specs)
    results = [job.result() for job in jobs]
    wall = time.monotonic() - start
    return wall, max(r["wall_time_s"] for r in results)


def run_orchestrator(folder: Path, population: int, sleep_s: float) -> tuple[float, float]:
    from launch.factory import build_launcher
    from meta.search.config import build_search_config
    from meta.search.generation.orchestrator import Orchestrator
    from meta.compose import compose
    from results.store.run_store import RunStore

    raw = compose([
        f"run_dir={folder}", f"population={population}", "generations=1", "launcher=local",
        "inner.entrypoint=meta.synthetic:member", f"+inner.options={{sleep_s:{sleep_s}}}",
    ])
    cfg = build_search_config(raw)
    store = RunStore(folder)
    orchestrator = Orchestrator(cfg, store, build_launcher(cfg.launcher_node), "bench")  # searcher built outside timing
    start = time.monotonic()
    orchestrator.run_generation(0)
    wall = time.monotonic() - start
    slowest = float(store.read_members()["wall_time_s"].max())
    return wall, slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=180)
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import evotorch.algorithms.functional  # noqa: F401  (import cost kept out of the timed region)

    ratios = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            base_wall, base_slowest = run_baseline(Path(tmp) / "baseline", args.population, args.sleep)
            orch_wall, orch_slowest = run_orchestrator(Path(tmp) / "orchestrator", args.population, args.sleep)
        base_over, orch_over = base_wall - base_slowest, orch_wall - orch_slowest
        ratios.append(orch_wall / base_wall)
        print(
            f"repeat {repeat}: population {args.population}, member sleep {args.sleep:g} s\n"
            f"  bare submitit map_array: wall {base_wall:7.2f} s, overhead {base_over:6.2f} s\n"
            f"  orchestrator generation: wall {orch_wall:7.2f} s, overhead {orch_over:6.2f} s\n"
            f"  overhead ratio {orch_over / base_over:.3f}x; generation wall ratio {orch_wall / base_wall:.3f}x "
            f"({100 * (orch_wall / base_wall - 1):+.1f}%)"
        )
    if len(ratios) > 1:
        print(f"median generation wall ratio over {len(ratios)} repeats: {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    main()
