"""Drive one generation's members to final outcomes: submit, re-attach, poll result files, retry, time out.

The result files are the source of truth, so this works the same whether the jobs were submitted by this
process or by an orchestrator that was killed: a member with a final result.json is never run again, a job
that is still alive is waited for, and only a job that ended without a result is resubmitted.
Retries archive the previous attempt's record as ``result.attempt<k>.json``; the number of archived records
IS the attempt counter, so the count survives restarts without any extra state.

A result.json is never overwritten from here. On a shared filesystem a file another node just created can
look absent for a while (NFS negative-lookup cache, up to ~60 s), so a job that ended without a visible result
is looked at again after ``result_grace_s`` (re-listing its directory first) before it counts as lost or
failed, and every record the orchestrator writes itself (timeout, failed, cancelled) is created only if no
result.json exists at that instant (hard link of a finished temp file, which the file server refuses when the
name exists); otherwise the member's own record is read and used.
The hard time limit counts running time only, from the member's ledger (launch/member.py), and is never
applied to a job the scheduler reports as queued (e.g. requeued and waiting for a node).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch.base import DEFAULT_KILL_GRACE_S, DEFAULT_MAX_LOST_RESUBMITS, JobRef, Launcher
from launch.member import RunLedger, read_ledger
from results.store.layout import RESULT_FILE, archived_result_name
from results.store.node_failure import read_node_failure
from core.records import DECIDED_STATUSES, NODE_FAILED, MemberSpec, ResultRecord
from results.store.member_files import read_result, write_result_if_absent

logger = logging.getLogger(__name__)

#: reading an existing result.json that the file server says is there (our create was refused) is retried
#: this many times, this far apart, before it counts as unreadable
EXISTING_READ_TRIES = 10
EXISTING_READ_PAUSE_S = 0.5


@dataclass
class RunnerPolicy:
    """How failures are handled: retries per member, the wall limit, and resubmits of lost jobs."""

    retries: int = 1
    timeout_s: float = 3600.0
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    max_lost_resubmits: int = DEFAULT_MAX_LOST_RESUBMITS
    result_scan_interval_s: float = 2.0
    #: give up on a job that waits this long in the scheduler's queue without running (a node down for
    #: good); None: no limit (backends without a queue)
    max_pending_s: float | None = None
    #: a job that ended without a visible result.json is looked at again this long after (re-listing its
    #: directory) before it counts as lost or failed: a shared filesystem may hide a file another node just
    #: wrote (NFS: up to ~60 s); 0 on a local filesystem
    result_grace_s: float = 0.0


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
    while (work_dir / archived_result_name(count)).exists():
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
        on_tick: Callable[["MemberArrayRunner"], None] | None = None,
        decided: Mapping[int, ResultRecord] | None = None,
    ) -> None:
        """``on_tick(runner)``: called once per polling round while members are in flight; it may read
        ``final``/``in_flight``/``specs`` and call ``stop_members`` (an ES generation closing at its quorum, a
        pruner). ``decided``: outcomes the caller decided earlier and recorded itself (e.g. the late members of a
        generation that closed before a restart): settled as given, whatever their result files say, and any
        job of theirs still alive is cancelled."""
        self.launcher = launcher
        self.entrypoint = entrypoint
        self.specs = {s.index: s for s in specs}
        self.jobs = {int(k): dict(v) for k, v in jobs.items()}
        self.save_jobs = save_jobs
        self.folder = launcher_folder
        self.policy = policy
        self.on_final = on_final
        self.should_abort = should_abort
        self.on_tick = on_tick
        self.decided = dict(decided or {})
        self.final: dict[int, ResultRecord] = {}
        self.in_flight: dict[int, JobRef] = {}
        self.queue: list[tuple[MemberSpec, int]] = []  # (spec with attempt, submissions so far)
        self.waiting_since: dict[int, tuple[str, float]] = {}  # index -> (job id, monotonic time first seen queued)
        self.ended_at: dict[int, float] = {}  # index -> monotonic time its job was first seen ended, no result
        self.queued_seen: dict[int, tuple[str, float]] = {}  # index -> (job id, wall time last seen queued)

    # ------------------------------------------------------------------ main
    def run(self) -> dict[int, ResultRecord]:
        for index in sorted(self.specs):
            self._reconcile(self.specs[index])
        self._check_abort()
        self._submit_queue()
        last_scan = 0.0
        while self.in_flight or self.queue:
            if self.on_tick is not None:
                self.on_tick(self)
                if not (self.in_flight or self.queue):
                    break
            self.launcher.progress()
            alive = self.launcher.alive(list(self.in_flight.values()))
            scan = time.monotonic() - last_scan >= self.policy.result_scan_interval_s
            queued: Mapping[str, str] = {}
            if scan:
                last_scan = time.monotonic()
                queued = self.launcher.waiting([ref for ref in self.in_flight.values() if ref.job_id in alive])
            for index, ref in list(self.in_flight.items()):
                if self.in_flight.get(index) is not ref:
                    continue  # settled meanwhile by a callback (on_final stopping a failed trial's other runs)
                self._poll(index, ref, ref.job_id in alive, scan, ref.job_id in queued)
            self._enforce_queue_limit()
            self._check_abort()
            self._submit_queue()
            pause = self.launcher.poll_interval_s
            if self.in_flight and len(self.ended_at) == len(self.in_flight):
                pause = max(pause, min(0.5, self.policy.result_scan_interval_s))  # all in their result grace
            if (self.in_flight or self.queue) and pause > 0:  # members queued for a slot wait here too
                time.sleep(pause)
        return dict(sorted(self.final.items()))

    # ------------------------------------------------------------- restarts
    def _reconcile(self, spec: MemberSpec) -> None:
        """Decide, from files alone, what a member needs: nothing, waiting for a live job, or a submission."""
        work_dir = Path(spec.work_dir)
        spec = dataclasses.replace(spec, attempt=archived_attempts(work_dir))
        self.specs[spec.index] = spec
        if spec.index in self.decided:
            entry = self.jobs.get(spec.index)
            if entry and self.launcher.is_alive(JobRef.from_dict(entry)):
                self.launcher.cancel([JobRef.from_dict(entry)])
            self._conclude(spec, self.decided[spec.index], keep_existing=False)
            return
        record = read_result(work_dir)
        if record is not None:
            self._settle(spec, record)
            return
        entry = self.jobs.get(spec.index)
        ref = JobRef.from_dict(entry) if entry else None
        if ref is not None and ref.attempt == spec.attempt:
            if self.launcher.is_alive(ref):
                logger.info("gen %d member %03d: re-attached to job %s", spec.generation, spec.index, ref.job_id)
            # An ended job is polled like any other: its result may not be visible yet (see result_grace_s).
            self.in_flight[spec.index] = ref
            return
        self.queue.append((spec, 0))

    # --------------------------------------------------------------- polling
    def _poll(self, index: int, ref: JobRef, alive: bool, scan: bool, queued: bool = False) -> None:
        """A dead job's result is read at once; live jobs' result files are only scanned every few seconds
        (a member can finish before its process exits), which keeps polling cheap for large arrays."""
        if alive and not scan:
            return
        if not alive and index in self.ended_at and not scan:
            return  # in its result grace period: re-read at the scan rate
        spec = self.specs[index]
        record = read_result(spec.work_dir)
        if record is None and alive:
            self.ended_at.pop(index, None)  # a job SLURM requeued after a node failure is alive again
            self._enforce_wall_limit(spec, ref, queued)
            return
        if record is None:
            record = self._recheck_ended(spec, ref)
            if record is None and index in self.ended_at:
                return
        self.ended_at.pop(index, None)
        del self.in_flight[index]
        if record is None:
            self._job_ended_without_result(spec, ref)
            return
        self._settle(spec, record)

    def _recheck_ended(self, spec: MemberSpec, ref: JobRef) -> ResultRecord | None:
        """The job ended and no result is visible: after ``result_grace_s`` (counted from when this process
        first saw it ended) re-list the member directory and read again. Returns the record if it showed up;
        None with the member still in ``ended_at`` while the grace runs, None and out of it once it is over."""
        now = time.monotonic()
        first = self.ended_at.setdefault(spec.index, now)
        if now - first < self.policy.result_grace_s:
            if first == now:
                logger.info("gen %d member %03d: job %s ended with no result visible yet; looking again in %g s",
                            spec.generation, spec.index, ref.job_id, self.policy.result_grace_s)
            return None
        del self.ended_at[spec.index]
        record = _fresh_read(Path(spec.work_dir))
        if record is not None and self.policy.result_grace_s > 0:
            logger.info("gen %d member %03d: result.json of job %s became visible within the grace period",
                        spec.generation, spec.index, ref.job_id)
        return record

    def _enforce_wall_limit(self, spec: MemberSpec, ref: JobRef, queued: bool) -> None:
        """Hard limit for members whose in-process alarm could not fire (hung in C code): running time of
        this attempt over all its runs, from the member's ledger. A job the launcher reports queued
        (``queued``: its ``waiting`` answer, e.g. requeued and waiting for a node) is never cancelled for
        time, and time queued is not charged to the others either (see _running_time)."""
        ledger = read_ledger(spec.work_dir)
        if ledger is None or ledger.attempt != spec.attempt:
            return  # not started yet
        now = time.time()
        if queued:
            self.queued_seen[spec.index] = (ref.job_id, now)
            return
        used = self._running_time(spec.index, ref, ledger, now)
        limit = self.policy.timeout_s + self.policy.kill_grace_s
        if used <= limit:
            return
        logger.warning("gen %d member %03d: %.0f s of running time is past the limit of %g s; cancelling job %s",
                       spec.generation, spec.index, used, limit, ref.job_id)
        self.launcher.cancel([ref])
        del self.in_flight[spec.index]
        self.queued_seen.pop(spec.index, None)
        record = ResultRecord(status="timeout", error=(
            f"killed after {used:.0f} s of running time over all runs of this attempt (limit {limit:g} s = "
            "inner.timeout_s + kill_grace_s; time queued does not count)"
        ))
        self._conclude(spec, record)

    def _running_time(self, index: int, ref: JobRef, ledger: RunLedger, now: float) -> float:
        """Running time of the attempt now: the ledger's, counted on from its last refresh while its run is
        running (RunLedger.used_at), so time queued after a run died is not charged even where the launcher
        does not report the queue (``waiting`` names only jobs that may never start; priority and resource
        waits are not reported). If this process saw the job queued after the ledger's run started, that run
        is over: its recorded time plus the time since the job was last seen queued is an upper bound until
        the new run writes. A member hung in C code keeps refreshing from its keeper thread (the GIL is
        released in most blocking calls) and is cancelled here; one frozen with the GIL held is left to the
        scheduler's own per-run time limit."""
        job_id, queued_at = self.queued_seen.get(index, (None, None))
        if job_id == ref.job_id and queued_at is not None and ledger.started_at <= queued_at:
            return ledger.used_s + (now - queued_at)
        return ledger.used_at(now)

    def _enforce_queue_limit(self) -> None:
        """Bound the wait for a job that may never (re)start: the launcher's ``waiting`` names only jobs pending
        for such a reason (a partition or node down for good, bad constraints, an invalid account), never jobs
        waiting their turn (priority, resources, QOS limits), which may wait as long as the queue takes. Past
        max_pending_s of continuously such a reason the job is cancelled and the member ends in ``timeout``
        (then retried as configured). The clock is this process's: a restarted orchestrator starts it afresh."""
        if self.policy.max_pending_s is None or not self.in_flight:
            return
        waiting = self.launcher.waiting(list(self.in_flight.values()))
        now = time.monotonic()
        for index, ref in list(self.in_flight.items()):
            if self.in_flight.get(index) is not ref:
                continue  # settled meanwhile by a callback
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
            logger.warning("gen %d member %03d: job %s pending for %.0f s for a reason that means it may never "
                           "start (%s); cancelling it",
                           spec.generation, spec.index, ref.job_id, now - since, waiting[ref.job_id])
            self.launcher.cancel([ref])
            del self.in_flight[index]
            del self.waiting_since[index]
            record = ResultRecord(status="timeout", error=(
                f"job {ref.job_id} waited in the scheduler queue for more than max_pending_s="
                f"{self.policy.max_pending_s:g} s for a reason that means it may never start (scheduler reason: "
                f"{waiting[ref.job_id]}); cancelled. Check `sinfo -R` (nodes down or drained), `scontrol show "
                "partition` and the job's constraints, account and QOS"
            ))
            self._conclude(spec, record)

    def _job_ended_without_result(self, spec: MemberSpec, ref: JobRef) -> None:
        # A cluster backend may know HOW the job ended (scancel, time limit, out of memory): that is the
        # member's outcome, not a lost job to resubmit. Local and debug backends answer None.
        ended = self.launcher.ended_status(ref)
        if ended is not None:
            status, reason = ended
            self._conclude(spec, ResultRecord(status=status, error=reason))
            return
        if ref.submissions <= self.policy.max_lost_resubmits:
            logger.warning(
                "gen %d member %03d: job %s ended without a result; resubmitting (%d/%d)",
                spec.generation, spec.index, ref.job_id, ref.submissions, self.policy.max_lost_resubmits,
            )
            self.queue.append((spec, ref.submissions))
            return
        node_failure = _node_failure(spec)
        if node_failure is not None:  # no node could run it: the nodes' failure, never charged to the init
            self._conclude(spec, ResultRecord(status=NODE_FAILED, error=(
                f"every node it was sent to could not run it; the last: {node_failure} "
                f"(after {ref.submissions} submissions)")))
            return
        reason = self.launcher.failure_reason(ref)
        self._conclude(spec, ResultRecord(status="failed", error=f"{reason} (after {ref.submissions} submissions)"))

    # -------------------------------------------------------------- outcomes
    def add_members(self, specs: Sequence[MemberSpec]) -> None:
        """More members for this run while it runs (a tuner's next trials, from ``on_tick`` or ``on_final``): each
        is reconciled from its files like the first ones and submitted with the next batch; the run goes on until
        they are final too. Indices must be new to this run."""
        for spec in specs:
            if spec.index in self.specs:
                raise ValueError(f"member index {spec.index} is already part of this run")
            self.specs[spec.index] = spec
            self._reconcile(spec)

    def stop_members(self, indices: Sequence[int], status: str, error: str,
                     records: Mapping[int, ResultRecord] | None = None) -> list[int]:
        """Stop members that are not final yet on the caller's decision (``status`` one of DECIDED_STATUSES):
        queued ones are never submitted, live jobs are cancelled, and each is settled final with a record of
        that status, never retried. A member whose own result.json is already there keeps it on disk (it is
        not overwritten), but the decision is what gets settled: the caller recorded it first so that a
        restart settles the same (``decided``). ``records``: per member, the record to settle instead of the plain
        one (an early stop's score and reason; its status must be ``status``). Returns the indices stopped."""
        if status not in DECIDED_STATUSES:
            raise ValueError(f"stop_members: status {status!r} is not one of {DECIDED_STATUSES}")
        wanted = {int(i) for i in indices} - set(self.final)
        refs = [self.in_flight[i] for i in sorted(wanted) if i in self.in_flight]
        self.launcher.cancel(refs)
        self.queue = [(spec, n) for spec, n in self.queue if spec.index not in wanted]
        for index in sorted(wanted):
            self.in_flight.pop(index, None)
            self.ended_at.pop(index, None)
            self.waiting_since.pop(index, None)
            self.queued_seen.pop(index, None)
            record = (records or {}).get(index) or ResultRecord(status=status, error=error)
            if record.status != status:
                raise ValueError(f"stop_members: member {index}'s record has status {record.status!r}, not {status!r}")
            self._conclude(self.specs[index], record, keep_existing=False)
        return sorted(wanted)

    def _conclude(self, spec: MemberSpec, record: ResultRecord, keep_existing: bool = True) -> None:
        """Record an outcome the orchestrator decided (timeout, failed, cancelled) and settle the member, unless
        a result.json is already there: then the member's own record wins and is what gets settled
        (``keep_existing``; False for a caller's decision, settled as decided with the file left as it is)."""
        if not write_result_if_absent(spec.work_dir, record) and keep_existing:
            existing = _read_existing(Path(spec.work_dir))
            logger.warning(
                "gen %d member %03d: result.json already exists (status %s); keeping it instead of writing %s",
                spec.generation, spec.index, existing.status, record.status,
            )
            record = existing
        self._settle(spec, record)

    def _settle(self, spec: MemberSpec, record: ResultRecord) -> None:
        """A final record, or archive this attempt and queue the next one (a member someone cancelled on
        purpose, e.g. with scancel, is not retried)."""
        if not record.ok and record.status not in DECIDED_STATUSES and spec.attempt < self.policy.retries:
            work_dir = Path(spec.work_dir)
            os.replace(work_dir / RESULT_FILE, work_dir / archived_result_name(spec.attempt))
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
        # decided on purpose (late, pruned, stopped early) is not a failure; a cancel by someone else is
        not_failures = set(DECIDED_STATUSES) - {"cancelled"}
        failed = sum(1 for r in self.final.values() if not r.ok and r.status not in not_failures)
        return ArrayProgress(total=len(self.specs), done=len(self.final), failed=failed, in_flight=len(self.in_flight))

    def _check_abort(self) -> None:
        if self.should_abort is None:
            return
        message = self.should_abort(self.final)
        if message:
            self.launcher.cancel(list(self.in_flight.values()))
            raise AbortRun(message)

    def _submit_queue(self) -> None:
        """Submit the queued members so that no submission is ever lost: members an earlier process
        submitted but never recorded (it died mid-submission) are re-attached first (launcher.recover), and
        jobs.json is saved after EACH chunk the launcher queues, so a later chunk's failure loses no job id.
        A submission the launcher gives up on ends the run with AbortRun (a message, exit status, no
        traceback); a resume re-attaches to what was queued and submits the rest."""
        if not self.queue:
            return
        from launch.base import SubmissionError  # local: this method is the only user

        batch, self.queue = self.queue, []
        cap = self.launcher.max_in_flight
        if cap is not None:  # the rest wait for free slots (a later round of run() submits them)
            free = max(0, cap - len(self.in_flight))
            batch, self.queue = batch[:free], batch[free:]
            if not batch:
                return
        try:
            recovered = self.launcher.recover(batch, self.folder)
        except SubmissionError as exc:
            self.queue = batch
            raise AbortRun(f"{exc}; nothing new was submitted. Resume the run once the scheduler answers") from exc
        if recovered:
            for spec, _ in batch:
                if spec.index in recovered:
                    self.in_flight[spec.index] = recovered[spec.index]
                    self.jobs[spec.index] = recovered[spec.index].to_dict()
            self.save_jobs(self.jobs)
            batch = [(spec, n) for spec, n in batch if spec.index not in recovered]
        if not batch:
            return
        specs = [spec for spec, _ in batch]
        done = 0
        try:
            for refs in self.launcher.submit_chunks(
                self.entrypoint, specs, self.folder, self.policy.timeout_s, [n for _, n in batch]
            ):
                for (spec, submissions), ref in zip(batch[done:done + len(refs)], refs):
                    ref.submissions = submissions + 1
                    self.in_flight[spec.index] = ref
                    self.jobs[spec.index] = ref.to_dict()
                done += len(refs)
                self.save_jobs(self.jobs)
        except SubmissionError as exc:
            self.queue = batch[done:] + self.queue
            raise AbortRun(
                f"{exc}. The {done} member(s) of this generation submitted before it are recorded in jobs.json and "
                f"stay queued; fix the cause and resume the run (python -m meta.run run_dir=<this run>): it "
                f"re-attaches to them and submits the remaining {len(batch) - done}"
            ) from exc
        if done < len(batch):  # the launcher had room for fewer (GPU slots still held): the rest wait their turn
            self.queue = batch[done:] + self.queue
        if done:
            logger.info("submitted %d member(s) to %s", done, self.folder)


def _fresh_read(work_dir: Path) -> ResultRecord | None:
    """Read result.json after listing its directory: a fresh directory read replaces a stale "no such file"
    that an NFS client may have cached for it."""
    try:
        os.listdir(work_dir)
    except OSError:
        return None
    return read_result(work_dir)


def _read_existing(work_dir: Path) -> ResultRecord:
    """The record in a result.json the file server says exists: retried briefly while this host cannot see
    it yet; a file that still does not parse is kept on disk and reported as a failure."""
    for attempt in range(EXISTING_READ_TRIES):
        record = _fresh_read(work_dir)
        if record is not None:
            return record
        if attempt + 1 < EXISTING_READ_TRIES:
            time.sleep(EXISTING_READ_PAUSE_S)
    return ResultRecord(status="failed", error=(
        f"{work_dir / RESULT_FILE} exists but could not be read as a result record after "
        f"{EXISTING_READ_TRIES} tries; it was left in place: inspect it, and delete it to run the member again"
    ))


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _node_failure(spec: MemberSpec) -> str | None:
    """'<node>: <cause>' when the member's last run ended because its node could not run it (a failed pre-flight or
    no usable GPU: inner_loop/member/preflight.py keeps that in the member's PREFLIGHT_FILE); None otherwise."""
    failure = read_node_failure(spec.work_dir)
    return f"{failure['host']}: {failure['cause']}" if failure else None
