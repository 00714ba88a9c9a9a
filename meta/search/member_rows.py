"""The lines the status views print (a search's members, a tune run's and a pilot's runs): read from files, never
written.

Apart from meta/status/view.py (the command, and a search's view) so that the tune view (meta/tune/status.py) and the pilot
view (meta/pilot/status.py), which the command picks by the run dir's kind, can use them without importing the
command back.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from launch.member import read_ledger
from meta.search.generation.live_watch import format_duration, generation_eta
from meta.search.lock import RunLock
from results.store.gpu_share import read_gpu_share, share_text
from core.gpu_time import gpu_time_h, members_per_gpu
from results.store.member_files import MemberProgress, read_progress, read_result
from core.records import device_text
from results.store.run_store import RunStore


#: the states of a member without a final record (a final one has its record's status: ok, failed, late, ...)
RUNNING, QUEUED, NOT_SUBMITTED = "running", "queued", "not submitted"
#: the states of a member that has not started: each counts as queued for an ETA
WAITING = (QUEUED, NOT_SUBMITTED)


@dataclass
class MemberRow:
    label: str
    state: str
    detail: str
    running_s: float | None
    progress: MemberProgress | None
    wall_s: float | None  # a finished member's own running time
    fitness: float | None = None
    gpu_share: str = ""  # the task and GPU it shared and with whom (results/store/gpu_share.py); "" alone
    sharers: int | None = None  # members on its GPU as its gpu_share.json says (itself included); None: no file


@dataclass(frozen=True)
class GpuUse:
    """The GPUs of one member (resources.gpus) and the members that share each (resources.members_per_gpu)."""

    gpus: int
    members_per_gpu: int = 1

    def hours(self, running_s: float, sharers: int | None = None) -> float:
        """GPU-hours of a member's running time: x gpus / k (core/gpu_time.py owns the formula).

        ``sharers``: the members its gpu_share.json says were on its GPU, itself included; a member that had the
        card to itself (the odd one of a packed generation) is charged the whole GPU, never more than k share it."""
        k = self.members_per_gpu if sharers is None else max(1, min(self.members_per_gpu, sharers))
        return gpu_time_h(running_s / 3600.0, self.gpus, k)


def gpu_use(raw: Mapping[str, Any]) -> GpuUse:
    """A run's GPU use per member, from its resolved config (a run made before members_per_gpu existed: 1)."""
    resources = raw.get("resources") or {}
    return GpuUse(int(resources.get("gpus") or 0), members_per_gpu(resources))


def member_row(label: str, work_dir: Path, job: Mapping[str, Any] | None, reasons: Mapping[str, str],
               now: float) -> MemberRow:
    """One member's state from its files (result, ledger, progress, the GPU it shared) and the scheduler's pending
    reasons."""
    row = _member_state(label, work_dir, job, reasons, now)
    share = read_gpu_share(work_dir)
    row.gpu_share = share_text(share)
    row.sharers = None if share is None else 1 + len(share["shared_with"])
    return row


def _member_state(label: str, work_dir: Path, job: Mapping[str, Any] | None, reasons: Mapping[str, str],
                  now: float) -> MemberRow:
    record = read_result(work_dir)
    ledger = read_ledger(work_dir)
    running_s = ledger.used_at(now) if ledger is not None else None
    if record is not None:
        detail = f"fitness {record.fitness:.4f}" if record.ok else record.error.strip().splitlines()[-1][:90] \
            if record.error.strip() else ""
        if record.device:  # where it trained, and its peak GPU memory
            detail = ", ".join(part for part in (detail, f"on {device_text(record.device)}") if part)
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
        return MemberRow(label, RUNNING, detail, running_s, progress, None)
    job_id = str(job.get("job_id")) if job else None
    if job_id is None:
        return MemberRow(label, NOT_SUBMITTED, "", running_s, None, None)
    reason = reasons.get(job_id)
    return MemberRow(label, QUEUED, f"job {job_id}" + (f", {reason}" if reason else ""), running_s, None, None)


def member_rows(members: Sequence[tuple[str, int, Path]], jobs: Mapping[int, Mapping[str, Any]],
                queue: RunQueue | None, now: float) -> list[MemberRow]:
    """The rows of (label, job index, work dir) members that share one jobs.json; ``queue``: the launcher asked once
    for the pending reasons of those not final yet (None: not asked; finished phases need none)."""
    reasons: dict[str, str] = {}
    if queue is not None:
        reasons = queue.reasons_of([str(jobs[i]["job_id"]) for _, i, work_dir in members
                                    if i in jobs and read_result(work_dir) is None])
    return [member_row(label, work_dir, jobs.get(i), reasons, now) for label, i, work_dir in members]


def state_summary(rows: Sequence[MemberRow]) -> str:
    """Rows per state, as the views print them ("1 failed, 3 ok, 2 running")."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def is_final(row: MemberRow) -> bool:
    """Whether the row's member has its final record (any state but running, queued or not submitted)."""
    return row.state not in (RUNNING, *WAITING)


def gpu_hours(rows: Sequence[MemberRow], use: GpuUse) -> float:
    """GPU-hours the members used so far: each one's running time (its ledger, else its record's) x resources.gpus /
    the members that shared its GPU (at most resources.members_per_gpu)."""
    return sum(use.hours(r.running_s or r.wall_s or 0.0, r.sharers) for r in rows)


def rows_eta(rows: Sequence[MemberRow], parallel: int | None) -> float | None:
    """Seconds until the last of these members is final (generation_eta over their measured times), None unknown."""
    finished = [r.wall_s for r in rows if r.state == "ok" and r.wall_s]
    running = [r.progress for r in rows if r.state == RUNNING]
    return generation_eta(finished, running, sum(1 for r in rows if r.state in WAITING), parallel)


def eta_text(eta: float | None) -> str:
    """An ETA as the views print it; unknown before any member measured a rate or finished."""
    return "ETA " + format_duration(eta) if eta is not None else "ETA unknown"


def row_line(row: MemberRow, use: GpuUse, label_width: int = 24) -> str:
    """A member's line: its label, state and detail, then its running time and GPU-hours when it has run, and the
    GPU it shared when it shared one."""
    used = row.running_s if row.running_s is not None else row.wall_s
    how_long = f"{format_duration(used)} running" if row.state == RUNNING else f"ran {format_duration(used or 0.0)}"
    time_text = f"{how_long}, {use.hours(used, row.sharers):.2f} GPU-h" if used else ""
    shared = f" | shared: {row.gpu_share}" if row.gpu_share else ""
    return f"  {row.label:<{label_width}s} {row.state:<13s} {row.detail:<60s} {time_text}{shared}"


@dataclass(frozen=True)
class RunQueue:
    """A run's launcher as the status views ask it (its class declares both, launch/base.py): why its queued jobs
    wait, and the slots an ETA may count on (None: as many as there are members)."""

    reasons_of: Callable[[Sequence[str]], dict[str, str]]
    parallel: int | None


def run_queue(raw: Mapping[str, Any]) -> RunQueue:
    """The queue of the launcher a resolved config names; one that cannot be asked where its class does not import
    here."""
    from launch.factory import launcher_class, launcher_options

    node = raw.get("launcher") or {}
    try:
        cls = launcher_class(node)
    except ValueError:
        return RunQueue(lambda job_ids: {}, None)
    options = launcher_options(node)
    return RunQueue(lambda job_ids: cls.pending_reasons(options, job_ids), cls.parallel_slots(options))


def orchestrator_line(store: RunStore) -> str:
    status = RunLock(store.lock_path).holder_status()
    if status is None:
        return "orchestrator: not running (no lock held)"
    alive, description = status
    return f"orchestrator: {'alive' if alive else 'not running'} ({description})"
