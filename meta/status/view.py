"""``python -m meta.status run_dir=... [--all] [--watch [SECONDS]]``: what a search, a tuning or a pilot is doing, and
when it will finish.

Read-only: it never takes the run's LOCK or writes a file, so it is safe while the orchestrator runs and works after
it died. Per generation a summary line; per member of the current generation (every generation with --all): its
state (queued, with SLURM's pending reason; running, with its step, last reward and regularizer gradient share from
progress.json; ok with its fitness; failed, timeout, late, cancelled, stopped_early with its early score), its running
time and GPU time (the member's ledger x resources.gpus / the members that shared its GPU, at most
resources.members_per_gpu), the GPU it shared, and an ETA
from the members' measured step rates. An online search (es=nres) labels its members' fitness as the change of
validation pass@1 over the truncation, gives no "best" of those changes, and shows as its progress each episode's mean
end score (validation pass@1 where a particle's run ended) and its best run (results/report/search/online.py). The
run dir's kind picks the view: a ``meta.tune`` run gets its trials (meta/tune/status.py), a ``meta.pilot`` run its runs
per (radius, coef) combination and role (meta/pilot/status.py), both with the same member rows
(meta/search/member_rows.py). Exit 2 when run_dir is none of the three.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from meta.search.generation.generation_shape import GenerationShape
from meta.search.generation.live_watch import format_duration
from meta.search.member_rows import (eta_text, gpu_hours, gpu_use, member_rows, orchestrator_line, row_line, rows_eta,
                                     run_queue, state_summary)
from meta.settings.upgrade import stored_config, stored_manifest
from results.report.arguments import run_dir_argument
from results.report.pilot import is_pilot_dir
from results.report.search.online import search_measure
from results.store.atomic import CorruptFileError
from core.config.horizon import horizon_text
from results.store.layout import parse_generation_dir_name, parse_member_dir_name
from results.store.run_store import RunStore
from results.store.study_store import read_study_file


def _generation_dirs(store: RunStore) -> list[int]:
    found = [parse_generation_dir_name(p.name) for p in store.root.iterdir() if p.is_dir()]
    return sorted(g for g in found if g is not None)


def _other_view(store: RunStore) -> Callable[[str | Path, bool, float | None], str] | None:
    """The view of a pilot or a tuning, picked by the run dir's kind; None for a search (its manifest has no kind).
    ValueError for a run dir of any other kind, which the search's view would misread."""
    if is_pilot_dir(store.root):  # manifest kind "pilot" (or its plan, should the manifest be unreadable)
        from meta.pilot.status import render_pilot

        return render_pilot
    if read_study_file(store.root) is not None:  # a meta.tune run (manifest kind "tune"), from its study
        from meta.tune.status import render_tune

        return render_tune
    try:
        kind = stored_manifest(store).get("kind")
    except CorruptFileError:
        kind = None  # a search still shows from its other files
    if kind is not None:
        raise ValueError(f"{store.root}: its manifest says kind {kind!r}; meta.status shows a search, a tuning (with "
                         "its study.json) or a pilot: pass the run_dir of python -m meta.run, meta.tune or meta.pilot")
    return None


def render(run_dir: str | Path, show_all: bool = False, now: float | None = None) -> str:
    """The status text of a search, a tuning or a pilot. ValueError when run_dir is none of them."""
    store = RunStore(run_dir)
    if not store.exists():
        raise ValueError(f"{run_dir}: not a search, tuning or pilot directory (no config.yaml); pass the run_dir of "
                         "python -m meta.run, meta.tune or meta.pilot")
    view = _other_view(store)
    if view is not None:
        return view(run_dir, show_all, now)
    now = time.time() if now is None else now
    raw = stored_config(store)
    population, generations = int(raw["population"]), int(raw["generations"])
    use = gpu_use(raw)
    queue = run_queue(raw)
    done = set(store.state_generations())
    gens = _generation_dirs(store)
    seeds = int(raw.get("seeds_per_member") or 1)
    per_member = f" x {seeds} seeds per member (fitness: their mean; runs in seed_NN/)" if seeds > 1 else ""
    measure = search_measure(store)  # what a member's fitness measures: a whole run's score or a truncation's change
    members_table = measure.members_of(store)
    lines = [f"run {store.root}: population {population}{per_member}, generation {len(done)} of {generations} done",
             *([horizon] if (horizon := horizon_text(raw)) else []), f"fitness: {measure.label}",
             orchestrator_line(store), *_particle_lines(store, raw, show_all),
             *measure.progress_lines(members_table, population), *measure.best_lines(store)]
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
        # the generation as the orchestrator counts it; whether it has a control member, from what it submitted
        shape = GenerationShape(population, control=population in indices)
        rows = member_rows([(f"member {i:03d}" + (" (control)" if i == shape.control_index else ""), i,
                             store.member_dir(generation, i)) for i in indices],
                           jobs, queue if generation not in done else None, now)
        summary = state_summary(rows)
        fitness = [r.fitness for r, i in zip(rows, indices) if shape.is_member(i) and r.fitness is not None]
        stats = measure.generation_text(members_table, generation, fitness)
        eta = None if generation in done else rows_eta(rows, queue.parallel)
        tag = "done" if generation in done else eta_text(eta)
        early = ""
        if saved.get(generation):
            early = (f" | early stop saved ~{use.hours(saved[generation]):.2f} GPU-h "
                     f"({format_duration(saved[generation])} of member time)")
        lines.append(f"gen {generation}: {summary}{stats} | GPU time {gpu_hours(rows, use):.2f} h{early} | {tag}")
        if generation not in done:
            current_eta = eta
        if show_all or generation == gens[-1]:
            lines.extend(row_line(row, use) for row in rows)
    remaining = generations - max(done, default=-1) - 1 - (1 if current_eta is not None else 0)
    if len(done) >= generations:
        lines.append(f"search finished: {generations} generation(s) done")
        lines.extend(_after_search(store, raw))
    elif remaining >= 0 and (walls or current_eta is not None):
        per = statistics.median(walls) if walls else (current_eta or math.nan)
        total = (current_eta or 0.0) + max(0, remaining) * per
        lines.append(f"search ETA: {format_duration(total)} ({max(0, remaining)} more generation(s) at "
                     f"{format_duration(per)} each, the median so far; re-evaluation not included)")
    return "\n".join(lines) + "\n"


def _particle_lines(store: RunStore, raw: Mapping[str, Any], show_all: bool) -> list[str]:
    """es=nres: where each particle stands in its run (what the last finished generation's state says each member
    trains next: results/store/truncation.py NEXT_SEGMENTS_KEY), and the disk its boundary checkpoints hold; nothing
    for a search whose members train runs of their own, or one stored before states kept segments."""
    from results.store.truncation import NEXT_SEGMENTS_KEY, boundary_bytes

    latest = store.latest_state()
    work = (latest[1].get(NEXT_SEGMENTS_KEY) if latest is not None else None) or []
    runs = [entry for entry in work if entry.get("run") is not None]
    if not runs:
        return []
    # particles that stand at the same step of the same run (an antithetic pair's halves) share a line: grouped by
    # what their stored segments say, not by the searcher's pairing rule
    groups: dict[tuple[Any, Any, Any], list[int]] = {}
    for entry in runs:
        groups.setdefault((entry["run"]["episode"], entry["start"], entry["stop"]), []).append(entry["run"]["particle"])
    horizon = runs[0]["horizon"]
    folders = [store.particle_dir(entry["run"]["particle"]) for entry in runs]
    lines = [f"particles (es={(raw.get('es') or {}).get('name')}): {len(folders)}, each a run of {horizon} steps; "
             f"boundary checkpoints {boundary_bytes(folders) / 1e9:.3f} GB"]
    for shown, ((episode, start, stop), particles) in enumerate(groups.items()):
        if show_all or shown < 4:
            names = "/".join(f"{int(p):03d}" for p in particles)
            lines.append(f"  particles {names}: run {episode}, step {start} of {horizon}, next truncation {start}..{stop}")
    if not show_all and len(groups) > 4:
        lines.append(f"  ... {len(groups) - 4} more (--all shows every one)")
    return lines


def _after_search(store: RunStore, raw: Mapping[str, Any]) -> list[str]:
    """What follows the generations (meta/search/after/reevaluate.py): the selection stage, then the result table, each done,
    under way (runs final of runs) or not started; or why it does not run at all."""
    settings = raw.get("reevaluate") or {}
    if not int(settings.get("top_k", 0) or 0):
        return ["selection: none (reevaluate.top_k=0); export which=center"]
    summary = store.read_reevaluation()
    done, total = store.reevaluation_progress()
    if summary is not None:
        lines = [f"selection: done ({done} runs), exported init: {summary.get('chosen')}"]
    else:
        lines = [f"selection: {done} of {total} runs final" if total else "selection: not started"]
    if not int(settings.get("report_seeds", 0) or 0):
        return lines + ["result table: none (reevaluate.report_seeds=0)"]
    done, total = store.reevaluation_progress(reporting=True)
    if store.read_result_table() is not None:
        return lines + [f"result table: done ({done} runs): {store.result_table_path.with_suffix('.md')}"]
    return lines + [f"result table: {done} of {total} runs final" if total else "result table: not started"]


def finished(run_dir: str | Path) -> bool:
    """Whether the run has nothing left to do: a search's generations, selection and result table (as configured),
    a pilot's summary, a tuning's trials."""
    store = RunStore(run_dir)
    if is_pilot_dir(store.root):
        return store.read_pilot() is not None
    if read_study_file(store.root) is not None:
        from meta.tune.status import tune_finished

        return tune_finished(store.root)
    raw = stored_config(store)
    if len(store.state_generations()) < int(raw["generations"]):
        return False
    settings = raw.get("reevaluate") or {}
    if int(settings.get("top_k", 0) or 0) and store.read_reevaluation() is None:
        return False
    return not (int(settings.get("top_k", 0) or 0) and int(settings.get("report_seeds", 0) or 0)
                and store.read_result_table() is None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.status", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="run_dir=<dir> (or just the directory)")
    parser.add_argument("--all", action="store_true", help="member rows of every generation, not just the current")
    parser.add_argument("--watch", nargs="?", type=float, const=30.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 30) until the run has finished or is interrupted")
    args = parser.parse_args(argv)
    run_dir = run_dir_argument(args.run_dir)
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
        if finished(run_dir):
            sys.stdout.write("finished: nothing more to watch\n")
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
