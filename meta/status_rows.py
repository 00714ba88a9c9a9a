"""The lines both status views print (a search's members, a tune run's runs): read from files, never written.

Apart from meta/status.py (the command, and a search's view) so that the tune view (meta/tune/status.py), which
the command picks for a tune run, can use them without importing the command back.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from launch.member import read_ledger
from meta.lock import RunLock
from results.store.progress import MemberProgress, read_progress
from results.store.records import read_result
from results.store.run_store import RunStore


@dataclass
class MemberRow:
    label: str
    state: str
    detail: str
    running_s: float | None
    progress: MemberProgress | None
    wall_s: float | None  # a finished member's own running time
    fitness: float | None = None


def member_row(label: str, work_dir: Path, job: Mapping[str, Any] | None, reasons: Mapping[str, str],
               now: float) -> MemberRow:
    """One member's state from its files (result, ledger, progress) and the scheduler's pending reasons."""
    record = read_result(work_dir)
    ledger = read_ledger(work_dir)
    running_s = ledger.used_at(now) if ledger is not None else None
    if record is not None:
        detail = f"fitness {record.fitness:.4f}" if record.ok else record.error.strip().splitlines()[-1][:90] \
            if record.error.strip() else ""
        return MemberRow(label, record.status, detail, running_s, None, record.wall_time_s,
                         record.fitness if record.ok else None)
    attempt = int(job.get("attempt", 0)) if job else 0
    if ledger is not None and ledger.attempt == attempt and ledger.running:
        progress = read_progress(work_dir)
        detail = "started"
        if progress is not None:
            parts = [f"step {progress.step}/{progress.max_steps}"]
            if progress.reward_mean is not None:
                parts.append(f"reward {progress.reward_mean:.3f}")
            if progress.regularizer_grad_share is not None:
                parts.append(f"grad share {progress.regularizer_grad_share:.3g}")
            detail = ", ".join(parts)
        return MemberRow(label, "running", detail, running_s, progress, None)
    job_id = str(job.get("job_id")) if job else None
    if job_id is None:
        return MemberRow(label, "not submitted", "", running_s, None, None)
    reason = reasons.get(job_id)
    return MemberRow(label, "queued", f"job {job_id}" + (f", {reason}" if reason else ""), running_s, None, None)


def slurm_reasons(job_ids: Sequence[str]) -> dict[str, str]:
    """SLURM's current pending reason per job id (one squeue call); {} where the scheduler cannot be asked."""
    if not job_ids:
        return {}
    from launch.slurm.queries import SlurmQueries, SlurmQueryError

    try:
        jobs = SlurmQueries(command_timeout_s=30.0).squeue_jobs()
    except (SlurmQueryError, OSError):
        return {}
    return {job_id: jobs[job_id] for job_id in job_ids if job_id in jobs and jobs[job_id] != "None"}


def orchestrator_line(store: RunStore) -> str:
    status = RunLock(store.lock_path).holder_status()
    if status is None:
        return "orchestrator: not running (no lock held)"
    alive, description = status
    return f"orchestrator: {'alive' if alive else 'not running'} ({description})"
