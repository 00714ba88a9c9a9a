"""``launcher=slurm``: each generation as SLURM job arrays (submitit), polled politely, re-attachable.

What the runner (launch/runner.py) needs from a backend is: submit an array, which jobs are still alive,
and how a dead job without a result ended. Here:
- submit: one ``sbatch --array`` per chunk of at most MaxArraySize members (submitit does not split), with
  SLURM_*/SBATCH_* variables of an enclosing SLURM job stripped, and each task a requeueable
  CheckpointableMember (launch/slurm_member.py);
- alive: answered from a cache refreshed by ONE batched sacct call at most every ``query_interval_s``
  (finished members are seen earlier through their result files, which the runner reads first); a job
  not yet in accounting (sacct lags a few seconds behind sbatch) counts as alive for ``sacct_grace_s``, and
  past that only squeue can vouch for it;
- ended_status: sacct's final state turned into a member status (scancel -> cancelled, time limit ->
  timeout, out of memory or a crash -> failed); node failures and unknown jobs are "lost" (None), which the
  runner resubmits. Jobs cancelled by the orchestrator itself (abort) are remembered in the launcher
  folder, so a resumed run resubmits them instead of recording them as cancelled.
- waiting: tasks sacct sees queued, e.g. requeued after their node went down; the runner cancels one
  queued longer than ``max_pending_s`` (a node down for good must not block the generation forever).
Re-attach needs no extra state: job ids in jobs.json are SLURM ids that sacct answers for.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from launch.base import JobRef
from launch.slurm_options import SlurmOptions
from launch.slurm_queries import SlurmQueries, SlurmQueryError, TaskState, base_job_id
from launch.submitit_launchers import SubmititLauncher
from results.atomic import atomic_write_json
from results.records import MemberSpec

logger = logging.getLogger(__name__)

CANCELLED_FILE = "cancelled_by_orchestrator.json"
#: sacct states of a job that waits in the queue (REQUEUED: between a requeue and pending again)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: ends that SLURM may undo by requeueing the job under the same id (JobRequeue=1): a job whose node went
#: down shows NODE_FAIL in sacct for a few seconds while squeue already lists it pending again
REQUEUABLE_ENDS = frozenset({"NODE_FAIL", "PREEMPTED"})
STDERR_TAIL_CHARS = 2000


class SlurmLauncher(SubmititLauncher):
    """Members as SLURM array tasks; see the module docstring for the polling and failure rules."""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        SlurmOptions.from_options(options)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = SlurmOptions.from_options(options)
        self.poll_interval_s = float(self.config.poll_interval_s)
        self.queries = SlurmQueries(self.config.command_timeout_s)
        self._states: dict[str, TaskState] = {}
        self._queried_at: dict[str, float] = {}  # base job id -> monotonic time of its last sacct answer
        self._last_query = float("-inf")
        self._submitted_at: dict[str, float] = {}
        self._squeue: set[str] = set()
        self._squeue_at = float("-inf")
        self._max_array_size: int | None = self.config.max_array_size
        self._time_min: int | None = None

    # ------------------------------------------------------------ submit
    def _make_executor(self, folder: Path, timeout_s: float) -> Any:
        import shlex
        import sys

        import submitit
        from submitit.slurm.slurm import SlurmJobEnvironment

        try:
            executor = submitit.SlurmExecutor(
                folder=folder, max_num_timeout=self.config.requeues,
                python=self.config.python_command(shlex.quote(sys.executable)),
            )
        except RuntimeError as exc:  # no srun on PATH
            raise SlurmQueryError(f"launcher=slurm needs the SLURM client tools here: {exc}") from exc
        executor.update_parameters(**self.config.sbatch_parameters(timeout_s, SlurmJobEnvironment.USR_SIG))
        return executor

    def max_array_size(self) -> int:
        """launcher.max_array_size, or the cluster's MaxArraySize (asked once)."""
        if self._max_array_size is None:
            self._max_array_size = self.queries.max_array_size()
        return self._max_array_size

    def submit(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float
    ) -> list[JobRef]:
        """One sbatch array per chunk of <= MaxArraySize specs; JobRefs in the order of ``specs``."""
        if not specs:
            return []
        import submitit

        from launch.slurm_member import CheckpointableMember

        folder.mkdir(parents=True, exist_ok=True)
        executor = self._make_executor(folder, timeout_s)
        self._time_min = self.config.time_limit_min(timeout_s)
        chunk = self.max_array_size()
        refs: list[JobRef] = []
        for start in range(0, len(specs), chunk):
            part = specs[start:start + chunk]
            # A job submitted from inside a SLURM job inherits its SLURM_*/SBATCH_* variables, and sbatch
            # reads SBATCH_* as options: members must not get the orchestrator's allocation settings.
            with submitit.helpers.clean_env():
                jobs = executor.map_array(
                    CheckpointableMember(), [entrypoint] * len(part), [s.to_dict() for s in part],
                    [timeout_s] * len(part),
                )
            now = time.monotonic()
            for spec, job in zip(part, jobs):
                job_id = str(job.job_id)
                self._jobs[job_id] = job
                self._submitted_at[job_id] = now
                self._queried_at.setdefault(base_job_id(job_id), now)  # known alive: no query needed yet
                refs.append(JobRef(job_id=job_id, folder=str(folder), attempt=spec.attempt))
            logger.info("submitted %d member(s) as SLURM array %s", len(part), base_job_id(refs[-1].job_id))
        return refs

    # ------------------------------------------------------------ liveness
    def alive(self, refs: Sequence[JobRef]) -> set[str]:
        ids = [ref.job_id for ref in refs]
        self._refresh(ids)
        return {job_id for job_id in ids if self._alive_from_cache(job_id)}

    def is_alive(self, ref: JobRef) -> bool:
        return ref.job_id in self.alive([ref])

    def _refresh(self, job_ids: Sequence[str]) -> None:
        """One batched sacct call when the cache is due, or when a job id was never asked about."""
        now = time.monotonic()
        bases = {base_job_id(j) for j in job_ids if not self._known_terminal(j)}
        never = {b for b in bases if b not in self._queried_at}
        due = now - self._last_query >= self.config.query_interval_s
        ask = bases if due else never
        if not ask:
            return
        try:
            states = self.queries.sacct(ask)
        except SlurmQueryError as exc:  # a busy controller is not a dead job: keep the last answer
            logger.warning("sacct failed (%s); keeping the last known job states", exc)
            self._last_query = now
            return
        self._states.update(states)
        for base in ask:
            self._queried_at[base] = now
        self._last_query = now

    def _state(self, job_id: str) -> TaskState | None:
        """A task's own sacct row, else its array's whole-job row (sacct shows a bare ``123`` for an array
        cancelled before its submission reached accounting)."""
        state = self._states.get(job_id)
        if state is None and "_" in job_id:
            state = self._states.get(base_job_id(job_id))
        return state

    def _known_terminal(self, job_id: str) -> bool:
        """Final for good: such a job is never asked about again (a requeueable end is asked again)."""
        state = self._state(job_id)
        return state is not None and state.terminal and state.state not in REQUEUABLE_ENDS

    def _alive_from_cache(self, job_id: str) -> bool:
        state = self._state(job_id)
        if state is not None and state.state in REQUEUABLE_ENDS:
            # requeued by SLURM (same id, resumes from its checkpoint) unless squeue no longer lists it
            return self._in_squeue(job_id, self._queried_at.get(base_job_id(job_id), float("-inf")))
        if state is not None:
            return not state.terminal
        submitted = self._submitted_at.get(job_id)
        now = time.monotonic()
        if submitted is not None and now - submitted < self.config.sacct_grace_s:
            return True  # accounting lags behind sbatch
        return self._in_squeue(job_id, submitted or float("-inf"))

    def _in_squeue(self, job_id: str, fresh_after: float) -> bool:
        """Whether squeue lists the job; its answer is reused unless older than ``fresh_after`` or than
        query_interval_s (one squeue call serves a whole poll round)."""
        now = time.monotonic()
        if self._squeue_at < fresh_after or now - self._squeue_at >= self.config.query_interval_s:
            try:
                self._squeue = self.queries.squeue_ids()
                self._squeue_at = now
            except SlurmQueryError as exc:
                logger.warning("squeue failed (%s); treating job %s as alive for now", exc, job_id)
                return True
        return job_id in self._squeue

    def waiting(self, refs: Sequence[JobRef]) -> dict[str, str]:
        """Tasks that sacct last saw queued (a new job, or one requeued after its node failed), with sacct's
        pending reason; tasks held back only by this array's own ``%array_parallelism`` throttle are not
        waiting for the cluster and are left out."""
        queued: dict[str, str] = {}
        for ref in refs:
            state = self._state(ref.job_id)
            if state is None or state.state not in QUEUED_STATES or state.reason == "JobArrayTaskLimit":
                continue
            queued[ref.job_id] = f"{state.state}, {state.reason or 'no reason given'}"
        return queued

    # ------------------------------------------------------------ endings
    def ended_status(self, ref: JobRef) -> tuple[str, str] | None:
        """(status, reason) for a dead job that left no result, or None when it was lost (resubmit it)."""
        state = self._state(ref.job_id)
        if state is None:
            return None
        where = f"SLURM job {ref.job_id} ended {state.state} (exit {state.exit_code}) without writing a result"
        if state.state == "CANCELLED":
            if ref.job_id in _read_cancelled(Path(ref.folder)):
                return None  # the orchestrator cancelled it (abort): a resumed run resubmits it
            return "cancelled", f"{where}: it was cancelled (scancel)"
        if state.state in ("TIMEOUT", "DEADLINE"):
            limit = f"{self._time_min} min" if self._time_min else "the job's --time"
            return "timeout", (
                f"{where}: it hit the time limit ({limit}) after up to launcher.requeues={self.config.requeues} "
                f"requeues; raise launcher.time_min or make the member checkpoint{self._stderr_tail(ref)}"
            )
        if state.state == "OUT_OF_MEMORY":
            return "failed", f"{where}: out of memory; raise launcher.mem_gb{self._stderr_tail(ref)}"
        if state.state in ("FAILED", "COMPLETED"):
            return "failed", f"{where}{self._stderr_tail(ref)}"
        return None  # NODE_FAIL, BOOT_FAIL, PREEMPTED, REVOKED: the member did nothing wrong; run it again

    def failure_reason(self, ref: JobRef) -> str:
        state = self._state(ref.job_id)
        seen = f"sacct state {state.state}" if state else "unknown to sacct and squeue"
        return f"SLURM job {ref.job_id} ended without writing a result ({seen}){self._stderr_tail(ref)}"

    def _stderr_tail(self, ref: JobRef) -> str:
        from submitit.core.utils import JobPaths

        path = JobPaths(ref.folder, job_id=ref.job_id, task_id=0).stderr
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return ""
        tail = text[-STDERR_TAIL_CHARS:].strip()
        return f"\n--- {path.name} (tail) ---\n{tail}" if tail else ""

    # ------------------------------------------------------------ cancel / close
    def cancel(self, refs: Sequence[JobRef]) -> None:
        """One scancel for all ``refs``; remembered so a resumed run resubmits them rather than giving up."""
        if not refs:
            return
        by_folder: dict[str, set[str]] = {}
        for ref in refs:
            by_folder.setdefault(ref.folder, set()).add(ref.job_id)
        for folder, ids in by_folder.items():
            path = Path(folder)
            atomic_write_json(path / CANCELLED_FILE, sorted(_read_cancelled(path) | ids))
        try:
            self.queries.scancel(ref.job_id for ref in refs)
        except SlurmQueryError as exc:
            logger.warning("could not cancel %d job(s): %s", len(refs), exc)

    def close(self) -> None:
        logger.info("SLURM launcher made %d scheduler queries (%s)", sum(self.queries.calls.values()),
                    ", ".join(f"{k} {v}" for k, v in sorted(self.queries.calls.items())) or "none")


def _read_cancelled(folder: Path) -> set[str]:
    import json

    try:
        return set(json.loads((folder / CANCELLED_FILE).read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return set()
