"""``python -m meta.status run_dir=<tune run>``: what a tuning is doing (meta.status picks this for a tune run).

Read-only like the search's status: the trials by state and the best so far from the study, then every running
trial's settings, its latest reported intermediate score, and each of its runs (queued with SLURM's reason, running
with its step, finished) from the runs' files.
"""
from __future__ import annotations

import time
from pathlib import Path

from meta.search.member_rows import member_row, orchestrator_line, run_queue
from meta.tune.trials import read_trial, trials_dir
from meta.settings.upgrade import stored_config
from results.store.layout import JOBS_FILE
from results.store.run_store import RunStore, read_jobs_file
from results.store.study_store import best_complete_trial, load_study, state_counts


def render_tune(run_dir: str | Path, show_all: bool = False, now: float | None = None) -> str:
    """The status text of a tune run; ``show_all`` adds the runs of finished trials."""
    from optuna.trial import TrialState

    store = RunStore(run_dir)
    now = time.time() if now is None else now
    raw = stored_config(store)
    target = int((raw.get("tune") or {}).get("trials", 0))
    study = load_study(run_dir)
    trials = study.get_trials(deepcopy=False)
    counts = state_counts(trials)
    counted = len(trials) - counts.get("LOST", 0)
    best = best_complete_trial(study)
    lines = [f"tune run {store.root}: study {study.study_name!r}, {counted} of {target} trials asked ("
             + ", ".join(f"{n} {state}" for state, n in counts.items()) + ")",
             orchestrator_line(store)]
    if best is not None:
        lines.append(f"best so far: trial {best.number}, {best.value:.4f} with {best.params}")
    jobs = read_jobs_file(trials_dir(run_dir) / JOBS_FILE)
    queue = run_queue(raw)
    for t in trials:
        if t.state != TrialState.RUNNING and not show_all:
            continue
        plan = read_trial(run_dir, t.number)
        last = max(t.intermediate_values, default=None)
        score = f", step {last}: {t.intermediate_values[last]:.4f}" if last is not None else ""
        value = f", value {t.value:.4f}" if t.value is not None else ""
        lines.append(f"trial {t.number} {t.state.name}{value}{score}: "
                     + (" ".join(plan.overrides) if plan else "no trial file"))
        if plan is None:
            continue
        queued = [str(jobs[s.index]["job_id"]) for s in plan.specs if s.index in jobs]
        reasons = queue.reasons_of(queued) if t.state == TrialState.RUNNING else {}
        for k, spec in enumerate(plan.specs):
            row = member_row(f"run {k}", Path(spec.work_dir), jobs.get(spec.index), reasons, now)
            lines.append(f"  {row.label:<8s} {row.state:<13s} {row.detail}")
    return "\n".join(lines) + "\n"


def tune_finished(run_dir: str | Path) -> bool:
    """Whether a tuning has nothing left to run: tune.trials trials asked and none of them running (a lost trial,
    asked again by the tuner, does not count)."""
    from optuna.trial import TrialState

    raw = stored_config(RunStore(run_dir))
    target = int((raw.get("tune") or {}).get("trials", 0))
    trials = load_study(run_dir).get_trials(deepcopy=False)
    final = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    return len(final) >= target and not any(t.state == TrialState.RUNNING for t in trials)

