"""``python -m meta.status run_dir=... [--all] [--watch [SECONDS]]``: what a search is doing, and when it will finish.

Read-only: it never takes the run's LOCK or writes a file, so it is safe while the orchestrator runs and works after
it died. Per generation a summary line; per member of the current generation (every generation with --all): its
state (queued, with SLURM's pending reason; running, with its step, last reward and regularizer gradient share from
progress.json; ok with its fitness; failed, timeout, late, cancelled, stopped_early with its early score), its running time and GPU time (the member's
ledger x resources.gpus), and an ETA from the members' measured step rates. A ``meta.tune`` run gets its trials
instead (meta/tune/status.py). Exit 2 when run_dir is not a search.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import yaml

from meta.live_watch import format_duration, generation_eta
from meta.status_rows import member_row, orchestrator_line, slurm_reasons
from results.store.layout import parse_generation_dir_name, parse_member_dir_name
from results.store.records import read_result
from results.store.run_store import RunStore
from results.store.study_store import read_study_file


def _generation_dirs(store: RunStore) -> list[int]:
    found = [parse_generation_dir_name(p.name) for p in store.root.iterdir() if p.is_dir()]
    return sorted(g for g in found if g is not None)


def render(run_dir: str | Path, show_all: bool = False, now: float | None = None) -> str:
    """The status text. ValueError when run_dir is not a search directory."""
    store = RunStore(run_dir)
    if not store.exists():
        raise ValueError(f"{run_dir}: not a search directory (no config.yaml); pass the run_dir of python -m meta.run")
    if read_study_file(store.root) is not None:  # a meta.tune run
        from meta.tune.status import render_tune

        return render_tune(run_dir, show_all, now)
    now = time.time() if now is None else now
    raw = yaml.safe_load(store.read_config_text()) or {}
    population, generations = int(raw["population"]), int(raw["generations"])
    gpus = int((raw.get("resources") or {}).get("gpus") or 0)
    slurm = (raw.get("launcher") or {}).get("name") == "slurm"
    parallel = (raw.get("launcher") or {}).get("array_parallelism") if slurm else None
    done = set(store.state_generations())
    gens = _generation_dirs(store)
    seeds = int(raw.get("seeds_per_member") or 1)
    per_member = f" x {seeds} seeds per member (fitness: their mean; runs in seed_NN/)" if seeds > 1 else ""
    lines = [f"run {store.root}: population {population}{per_member}, generation {len(done)} of {generations} done",
             orchestrator_line(store)]
    gen_table = store.read_generations()
    walls = [float(w) for w in gen_table["wall_time_s"]] if len(gen_table) and "wall_time_s" in gen_table else []
    saved: dict[int, float] = {}
    if len(gen_table) and "member_seconds_saved" in gen_table:
        saved = {int(g): float(s) for g, s in zip(gen_table["generation"], gen_table["member_seconds_saved"].fillna(0))}
    current_eta = None
    for generation in gens:
        jobs = store.read_jobs(generation)
        on_disk = {parse_member_dir_name(p.name) for p in store.generation_dir(generation).iterdir() if p.is_dir()}
        indices = sorted(set(range(population)) | set(jobs) | {i for i in on_disk if i is not None})
        queued_ids = [str(jobs[i]["job_id"]) for i in indices if i in jobs and read_result(store.member_dir(generation, i)) is None]
        reasons = slurm_reasons(queued_ids) if slurm and generation not in done else {}
        rows = [member_row(f"member {i:03d}" + (" (control)" if i == population else ""),
                           store.member_dir(generation, i), jobs.get(i), reasons, now) for i in indices]
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        fitness = [r.fitness for r in rows[:population] if r.fitness is not None]
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        stats = f" | best {max(fitness):.4f}, mean {statistics.fmean(fitness):.4f}" if fitness else ""
        finished = [r.wall_s for r in rows if r.state == "ok" and r.wall_s]
        running = [r.progress for r in rows if r.state == "running"]
        queued = counts.get("queued", 0) + counts.get("not submitted", 0)
        eta = None if generation in done else generation_eta(finished, running, queued, int(parallel) if parallel else None)
        tag = "done" if generation in done else ("ETA " + format_duration(eta) if eta is not None else "ETA unknown")
        gpu_h = sum(r.running_s or r.wall_s or 0.0 for r in rows) * gpus / 3600.0
        early = ""
        if saved.get(generation):
            early = (f" | early stop saved ~{saved[generation] * gpus / 3600.0:.2f} GPU-h "
                     f"({format_duration(saved[generation])} of member time)")
        lines.append(f"gen {generation}: {summary}{stats} | GPU time {gpu_h:.2f} h{early} | {tag}")
        if generation not in done:
            current_eta = eta
        if show_all or generation == gens[-1]:
            for row in rows:
                used = row.running_s if row.running_s is not None else row.wall_s
                time_text = f"{format_duration(used)} running, {used * gpus / 3600.0:.2f} GPU-h" if used else ""
                lines.append(f"  {row.label:<24s} {row.state:<13s} {row.detail:<60s} {time_text}")
    remaining = generations - max(done, default=-1) - 1 - (1 if current_eta is not None else 0)
    if remaining >= 0 and (walls or current_eta is not None):
        per = statistics.median(walls) if walls else (current_eta or math.nan)
        total = (current_eta or 0.0) + max(0, remaining) * per
        lines.append(f"search ETA: {format_duration(total)} ({max(0, remaining)} more generation(s) at "
                     f"{format_duration(per)} each, the median so far; re-evaluation not included)")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.status", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="run_dir=<dir> (or just the directory)")
    parser.add_argument("--all", action="store_true", help="member rows of every generation, not just the current")
    parser.add_argument("--watch", nargs="?", type=float, const=30.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 30) until interrupted")
    args = parser.parse_args(argv)
    run_dir = args.run_dir.partition("=")[2] if args.run_dir.startswith("run_dir=") else args.run_dir
    while True:
        try:
            text = render(run_dir, args.all)
        except ValueError as exc:
            sys.stderr.write(f"status error: {exc}\n")
            return 2
        if args.watch and sys.stdout.isatty():
            sys.stdout.write("\033[2J\033[H")
        sys.stdout.write(text)
        sys.stdout.flush()
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
