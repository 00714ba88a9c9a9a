"""Drive one generation's members to final outcomes: submit, re-attach, poll result files, retry, time out.

The result files are the source of truth, so this works the same whether the jobs were submitted by this
process or by an orchestrator that was killed: a member with a final result.json is never run again, a job
that is still alive is waited for, and only a job that ended without a result is resubmitted.
Retries archive the previous attempt's record as ``result.attempt<k>.json``; the number of archived records
IS the attempt counter, so the count survives restarts without any extra state.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch.base import JobRef, Launcher
from launch.member import STARTED_FILE
from results.records import RESULT_FILE, MemberSpec, ResultRecord, read_result, write_result

logger = logging.getLogger(__name__)

ARCHIVE_PATTERN = "result.attempt{}.json"


@dataclass
class RunnerPolicy:
    """How failures are handled: retries per member, the wall limit, and resubmits of lost jobs."""

    retries: int = 1
    timeout_s: float = 3600.0
    kill_grace_s: float = 30.0
    max_lost_resubmits: int = 3
    result_scan_interval_s: float = 2.0
    #: give up on a job that waits this long in the scheduler's queue without running (a node down for
    #: good); None: no limit (backends without a queue)
    max_pending_s: float | None = None


@dataclass
class ArrayProgress:
    total: int
    done: int
    failed: int
    in_flight: int


class AbortRun(RuntimeError):
    """Raised when the caller's abort check fires (e.g. too many failed members)."""


def archived_attempts(work_dir: Path) -> int:
    """How many earlier attempts of this member were archived (= the current attempt number)."""
    count = 0
    while (work_dir / ARCHIVE_PATTERN.format(count)).exists():
        count += 1
    return count


class MemberArrayRunner:
    """Runs ``specs`` (one generation) to one final ResultRecord each."""

    def __init__(
        self,
        launcher: Launcher,
        entrypoint: str,
        specs: Sequence[MemberSpec],
        jobs: Mapping[int, Mapping[str, object]],
        save_jobs: Callable[[dict[int, dict[str, object]]], None],
        launcher_folder: Path,
        policy: RunnerPolicy,
        on_final: Callable[[MemberSpec, ResultRecord, ArrayProgress], None] | None = None,
        should_abort: Callable[[Mapping[int, ResultRecord]], str | None] | None = None,
    ) -> None:
        self.launcher = launcher
        self.entrypoint = entrypoint
        self.specs = {s.index: s for s in specs}
        self.jobs = {int(k): dict(v) for k, v in jobs.items()}
        self.save_jobs = save_jobs
        self.folder = launcher_folder
        self.policy = policy
        self.on_final = on_final
        self.should_abort = should_abort
        self.final: dict[int, ResultRecord] = {}
        self.in_flight: dict[int, JobRef] = {}
        self.queue: list[tuple[MemberSpec, int]] = []  # (spec with attempt, submissions so far)
        self.waiting_since: dict[int, tuple[str, float]] = {}  # index -> (job id, monotonic time first seen queued)

    # ------------------------------------------------------------------ main
    def run(self) -> dict[int, ResultRecord]:
        for index in sorted(self.specs):
            self._reconcile(self.specs[index])
        self._check_abort()
        self._submit_queue()
        last_scan = 0.0
        while self.in_flight or self.queue:
            self.launcher.progress()
            alive = self.launcher.alive(list(self.in_flight.values()))
            scan = time.monotonic() - last_scan >= self.policy.result_scan_interval_s
            if scan:
                last_scan = time.monotonic()
            for index, ref in list(self.in_flight.items()):
                self._poll(index, ref, ref.job_id in alive, scan)
            self._enforce_queue_limit()
            self._check_abort()
            self._submit_queue()
            if self.in_flight and self.launcher.poll_interval_s > 0:
                time.sleep(self.launcher.poll_interval_s)
        return dict(sorted(self.final.items()))

    # ------------------------------------------------------------- restarts
    def _reconcile(self, spec: MemberSpec) -> None:
        """Decide, from files alone, what a member needs: nothing, waiting for a live job, or a submission."""
        work_dir = Path(spec.work_dir)
        spec = dataclasses.replace(spec, attempt=archived_attempts(work_dir))
        self.specs[spec.index] = spec
        record = read_result(work_dir)
        if record is not None:
            self._settle(spec, record)
            return
        entry = self.jobs.get(spec.index)
        ref = JobRef.from_dict(entry) if entry else None
        if ref is not None and ref.attempt == spec.attempt:
            if self.launcher.is_alive(ref):
                logger.info("gen %d member %03d: re-attached to job %s", spec.generation, spec.index, ref.job_id)
                self.in_flight[spec.index] = ref
            else:
                self._job_ended_without_result(spec, ref)
            return
        self.queue.append((spec, 0))

    # --------------------------------------------------------------- polling
    def _poll(self, index: int, ref: JobRef, alive: bool, scan: bool) -> None:
        """A dead job's result is read at once; live jobs' result files are only scanned every few seconds
        (a member can finish before its process exits), which keeps polling cheap for large arrays."""
        if alive and not scan:
            return
        spec = self.specs[index]
        record = read_result(spec.work_dir)
        if record is None and alive:
            self._enforce_wall_limit(spec, ref)
            return
        del self.in_flight[index]
        if record is None:
            self._job_ended_without_result(spec, ref)
            return
        self._settle(spec, record)

    def _enforce_wall_limit(self, spec: MemberSpec, ref: JobRef) -> None:
        """Hard limit for members whose in-process alarm could not fire (hung in C code)."""
        started = _read_started(Path(spec.work_dir))
        if started is None or started.get("attempt") != spec.attempt:
            return
        limit = self.policy.timeout_s + self.policy.kill_grace_s
        if time.time() - float(started.get("time", time.time())) <= limit:
            return
        logger.warning("gen %d member %03d: past the wall limit, cancelling job %s", spec.generation, spec.index, ref.job_id)
        self.launcher.cancel([ref])
        del self.in_flight[spec.index]
        record = ResultRecord(status="timeout", error=f"killed after {limit:g} s (inner.timeout_s + kill_grace_s)")
        write_result(spec.work_dir, record)
        self._settle(spec, record)

    def _enforce_queue_limit(self) -> None:
        """Bound the wait for a job that never (re)starts, e.g. requeued after its node went down for good:
        past max_pending_s of continuous queueing it is cancelled and the member ends in ``timeout`` (then
        retried as configured). The clock is this process's: a restarted orchestrator starts it afresh."""
        if self.policy.max_pending_s is None or not self.in_flight:
            return
        waiting = self.launcher.waiting(list(self.in_flight.values()))
        now = time.monotonic()
        for index, ref in list(self.in_flight.items()):
            if ref.job_id not in waiting:
                self.waiting_since.pop(index, None)
                continue
            job_id, since = self.waiting_since.get(index, (None, now))
            if job_id != ref.job_id:
                self.waiting_since[index] = (ref.job_id, now)
                continue
            if now - since <= self.policy.max_pending_s:
                continue
            spec = self.specs[index]
            logger.warning("gen %d member %03d: job %s queued for %.0f s without running (%s); cancelling it",
                           spec.generation, spec.index, ref.job_id, now - since, waiting[ref.job_id])
            self.launcher.cancel([ref])
            del self.in_flight[index]
            del self.waiting_since[index]
            record = ResultRecord(status="timeout", error=(
                f"job {ref.job_id} waited in the scheduler queue for more than max_pending_s="
                f"{self.policy.max_pending_s:g} s without running (scheduler reason: {waiting[ref.job_id]}); "
                "cancelled. A node down or drained for good keeps jobs queued: check `sinfo -R`, or raise "
                "launcher.max_pending_s on a busy cluster"
            ))
            write_result(spec.work_dir, record)
            self._settle(spec, record)

    def _job_ended_without_result(self, spec: MemberSpec, ref: JobRef) -> None:
        # A cluster backend may know HOW the job ended (scancel, time limit, out of memory): that is the
        # member's outcome, not a lost job to resubmit. Local and debug backends answer None.
        ended = self.launcher.ended_status(ref)
        if ended is not None:
            status, reason = ended
            record = ResultRecord(status=status, error=reason)
            write_result(spec.work_dir, record)
            self._settle(spec, record)
            return
        if ref.submissions <= self.policy.max_lost_resubmits:
            logger.warning(
                "gen %d member %03d: job %s ended without a result; resubmitting (%d/%d)",
                spec.generation, spec.index, ref.job_id, ref.submissions, self.policy.max_lost_resubmits,
            )
            self.queue.append((spec, ref.submissions))
            return
        reason = self.launcher.failure_reason(ref)
        record = ResultRecord(status="failed", error=f"{reason} (after {ref.submissions} submissions)")
        write_result(spec.work_dir, record)
        self._settle(spec, record)

    # -------------------------------------------------------------- outcomes
    def _settle(self, spec: MemberSpec, record: ResultRecord) -> None:
        """A final record, or archive this attempt and queue the next one (a member someone cancelled on
        purpose, e.g. with scancel, is not retried)."""
        if not record.ok and record.status != "cancelled" and spec.attempt < self.policy.retries:
            work_dir = Path(spec.work_dir)
            os.replace(work_dir / RESULT_FILE, work_dir / ARCHIVE_PATTERN.format(spec.attempt))
            logger.warning(
                "gen %d member %03d: attempt %d %s (%s); retrying",
                spec.generation, spec.index, spec.attempt, record.status, _first_line(record.error),
            )
            retry = dataclasses.replace(spec, attempt=spec.attempt + 1)
            self.specs[spec.index] = retry
            self.queue.append((retry, 0))
            return
        self.final[spec.index] = record
        if self.on_final is not None:
            self.on_final(spec, record, self._progress())

    def _progress(self) -> ArrayProgress:
        failed = sum(1 for r in self.final.values() if not r.ok)
        return ArrayProgress(total=len(self.specs), done=len(self.final), failed=failed, in_flight=len(self.in_flight))

    def _check_abort(self) -> None:
        if self.should_abort is None:
            return
        message = self.should_abort(self.final)
        if message:
            self.launcher.cancel(list(self.in_flight.values()))
            raise AbortRun(message)

    def _submit_queue(self) -> None:
        if not self.queue:
            return
        batch, self.queue = self.queue, []
        specs = [spec for spec, _ in batch]
        refs = self.launcher.submit(self.entrypoint, specs, self.folder, self.policy.timeout_s)
        for (spec, submissions), ref in zip(batch, refs):
            ref.submissions = submissions + 1
            self.in_flight[spec.index] = ref
            self.jobs[spec.index] = ref.to_dict()
        self.save_jobs(self.jobs)
        logger.info("submitted %d member(s) as one array to %s", len(refs), self.folder)


def _read_started(work_dir: Path) -> dict | None:
    try:
        return json.loads((work_dir / STARTED_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
