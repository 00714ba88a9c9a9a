"""``launcher=slurm``: each generation as SLURM job arrays (submitit), polled politely, re-attachable.

What the runner (launch/runner.py) needs from a backend is: submit an array, which jobs are still alive,
and how a dead job without a result ended. Here:
- submit: one ``sbatch --array`` per chunk of at most MaxArraySize members (submitit does not split), with
  SLURM_*/SBATCH_* variables of an enclosing SLURM job stripped, and each task a requeueable
  CheckpointableMember (launch/slurm/member.py);
- alive: answered from a cache refreshed by ONE batched sacct call at most every ``query_interval_s``
  (finished members are seen earlier through their result files, which the runner reads first); a job
  not yet in accounting (sacct lags a few seconds behind sbatch) counts as alive for ``sacct_grace_s``, and
  past that only squeue can vouch for it;
- ended_status: sacct's final state turned into a member status (scancel -> cancelled, time limit ->
  timeout, out of memory or a crash -> failed); node failures and unknown jobs are "lost" (None), which the
  runner resubmits. Jobs cancelled by the orchestrator itself (abort) are remembered in the launcher
  folder, so a resumed run resubmits them instead of recording them as cancelled.
- pre-flight: a member whose node failed its pre-flight (inner_loop/member/preflight.py) ends FAILED without a result and
  with the node and cause in its PREFLIGHT_FILE; that job is lost, not failed: the runner resubmits it (at most
  ``max_lost_resubmits`` times, the init never charged) and its next array excludes every node it failed on
  (``sbatch --exclude``). Which member a job ran is known to the process that submitted it.
- waiting: tasks sacct sees queued for a reason that means they may never start (partition down, a node
  down for good after a requeue, bad constraints); the runner cancels one pending like that longer than
  ``max_pending_s``. Tasks waiting their turn (priority, resources, QOS limits) are never given up on.
- recover: each chunk is named and marked before its sbatch (launch/slurm/chunks.py), so a resume after a
  failed or interrupted submission re-attaches to what was queued instead of submitting it twice.
Re-attach needs no extra state: job ids in jobs.json are SLURM ids that sacct answers for.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from launch.base import JobRef, LauncherPlan, PlanContext, SubmissionError
from launch.slurm.chunks import ChunkMarker, chunk_job_name, next_chunk_number, read_markers, write_marker
from launch.slurm.options import GPU_SHARING, SlurmOptions
from launch.slurm.plan import slurm_plan
from launch.slurm.queries import SlurmQueries, SlurmQueryError, TaskState, base_job_id, pending_may_never_start
from launch.submitit_base import SubmititLauncher, check_gpus_per_member
from results.store.atomic import atomic_write_json
from results.store.layout import CANCELLED_FILE, MEMBER_LOG_FILE
from results.store.node_failure import read_node_failure
from core.records import MemberSpec
from results.store.member_files import read_result

logger = logging.getLogger(__name__)

#: sacct states of a job that waits in the queue (REQUEUED: between a requeue and pending again)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: ends that SLURM may undo by requeueing the job under the same id (JobRequeue=1): a job whose node went
#: down shows NODE_FAIL in sacct for a few seconds while squeue already lists it pending again
REQUEUABLE_ENDS = frozenset({"NODE_FAIL", "PREEMPTED"})
STDERR_TAIL_CHARS = 2000


class SlurmLauncher(SubmititLauncher):
    """Members as SLURM array tasks; see the module docstring for the polling and failure rules."""

    #: the queue summary (how many tasks wait, and why) is logged at most this often, or on a new reason
    queue_log_interval_s: float = 300.0
    gpu_sharing = GPU_SHARING
    name = "slurm"
    settings_class = SlurmOptions
    namespace_kind = "SLURM cluster"

    @classmethod
    def parallel_slots(cls, options: Mapping[str, Any]) -> int | None:
        """The arrays' %parallelism (launcher.array_parallelism)."""
        parallel = options.get("array_parallelism")
        return int(parallel) if parallel else None

    @classmethod
    def pending_reasons(cls, options: Mapping[str, Any], job_ids: Sequence[str]) -> dict[str, str]:
        """SLURM's current pending reason per job id (one squeue call); {} where the scheduler cannot be asked."""
        if not job_ids:
            return {}
        try:
            jobs = SlurmQueries(command_timeout_s=30.0).squeue_jobs()
        except (SlurmQueryError, OSError):
            return {}
        return {job_id: jobs[job_id] for job_id in job_ids if job_id in jobs and jobs[job_id] != "None"}

    @classmethod
    def plan(cls, name: str, options: Mapping[str, Any], context: PlanContext) -> LauncherPlan:
        """Arrays per generation, packing, members at once, the time limit and the first array's script."""
        return slurm_plan(options, context)

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        check_gpus_per_member("launcher.gpus_per_node", SlurmOptions.from_options(options).gpus_per_node)

    @classmethod
    def job_namespace(cls, options: Mapping[str, Any]) -> str:
        """The cluster's ClusterName (one ``scontrol show config`` call); ValueError when it cannot be asked."""
        try:
            text = SlurmQueries(float(options.get("command_timeout_s", 60.0))).run(["scontrol", "show", "config"])
        except SlurmQueryError as exc:
            raise ValueError(
                f"launcher=slurm: cannot ask the cluster its name ({exc}); is this a SLURM login node?"
            ) from None
        match = re.search(r"^ClusterName\s*=\s*(\S+)", text, re.MULTILINE)
        if match is None:
            raise ValueError("launcher=slurm: `scontrol show config` reports no ClusterName")
        return match.group(1)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = SlurmOptions.from_options(options)
        self.poll_interval_s = float(self.config.poll_interval_s)
        self.queries = SlurmQueries(self.config.command_timeout_s)
        self._states: dict[str, TaskState] = {}
        self._queried_at: dict[str, float] = {}  # base job id -> monotonic time of its last sacct answer
        self._last_query = float("-inf")
        self._submitted_at: dict[str, float] = {}
        self._squeue: dict[str, str] = {}  # job id -> pending reason, from the last squeue call
        self._squeue_at = float("-inf")
        self._max_array_size: int | None = self.config.max_array_size
        self._time_min: int | None = None
        self._queue_logged_at = float("-inf")
        self._reasons_logged: set[tuple[str, bool]] = set()
        self._excluded: dict[str, set[str]] = {}  # member work dir -> nodes it failed its pre-flight on

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
        """All chunks at once (see submit_chunks); JobRefs in the order of ``specs``."""
        return [ref for part in self.submit_chunks(entrypoint, specs, folder, timeout_s) for ref in part]

    def submit_chunks(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float,
        submissions: Sequence[int] | None = None,
    ) -> Iterator[list[JobRef]]:
        """One sbatch array per chunk of <= MaxArraySize specs, each named and marked (launch/slurm/chunks.py)
        before its sbatch; yields each chunk's JobRefs as soon as it is queued, so they are recorded before
        the next chunk is tried. SubmissionError once a chunk's sbatch failed submit_attempts times."""
        if not specs:
            return
        runs = {(s.run_id, s.generation) for s in specs}
        if len(runs) != 1:
            raise ValueError(f"one submission must hold one generation of one run; got {sorted(runs)}")
        run_id, generation = runs.pop()
        counts = list(submissions) if submissions is not None else [0] * len(specs)
        if len(counts) != len(specs):
            raise ValueError(f"{len(counts)} submission counts for {len(specs)} specs")
        folder.mkdir(parents=True, exist_ok=True)
        executor = self._make_executor(folder, timeout_s)
        self._time_min = self.config.time_limit_min(timeout_s)
        per_task = self.config.members_per_task
        size = self.max_array_size() * per_task
        chunk = next_chunk_number(folder)
        for start in range(0, len(specs), size):
            part = specs[start:start + size]
            marker = ChunkMarker(
                chunk=chunk, name=chunk_job_name(self.config.job_name, run_id, generation, chunk),
                members=[(s.index, s.attempt, n + 1) for s, n in zip(part, counts[start:start + size])],
                tasks=[k // per_task for k in range(len(part))] if per_task > 1 else None,
            )
            chunk += 1
            write_marker(folder, marker)  # before sbatch: a crash after it is found by name on resume
            packs = [list(part[k:k + per_task]) for k in range(0, len(part), per_task)]
            jobs = self._sbatch_chunk(executor, marker, entrypoint, packs, timeout_s)
            marker.job_id = base_job_id(str(jobs[0].job_id))
            write_marker(folder, marker)
            now = time.monotonic()
            refs = []
            for pack, job in zip(packs, jobs):
                job_id = str(job.job_id)
                self._jobs[job_id] = job
                self._submitted_at[job_id] = now
                self._queried_at.setdefault(base_job_id(job_id), now)  # known alive: no query needed yet
                for spec in pack:
                    refs.append(JobRef(job_id=job_id, folder=str(folder), attempt=spec.attempt, work_dir=spec.work_dir,
                                       packed_with=[s.work_dir for s in pack if s is not spec]))
            logger.info("submitted %d member(s) as SLURM array %s (%s)%s", len(part), marker.job_id, marker.name,
                        f", {per_task} per task" if per_task > 1 else "")
            yield refs

    def _sbatch_chunk(
        self, executor: Any, marker: ChunkMarker, entrypoint: str, packs: Sequence[Sequence[MemberSpec]],
        timeout_s: float,
    ) -> list[Any]:
        """sbatch one chunk (one array task per pack of members), retried with exponential backoff. A failed sbatch
        may still have queued the array (e.g. the controller answered too late): such tasks have no pickled call
        and would only fail, so they are found by name and cancelled before the next try."""
        import submitit
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        from launch.slurm.member import CheckpointableMember
        from launch.slurm.packed import PackedMembers

        attempts = self.config.submit_attempts
        part = [spec for pack in packs for spec in pack]
        excluded = self._nodes_to_exclude(part)
        if excluded:
            logger.info("array %s excludes node(s) %s, where its members failed their pre-flight", marker.name,
                        excluded)
        extra = dict(getattr(executor, "parameters", {}).get("additional_parameters") or {})
        if "exclude" in extra:  # the user's own --exclude, widened in place: a second line would lose to it
            executor.update_parameters(additional_parameters={**extra, "exclude": excluded})
        else:
            executor.update_parameters(exclude=excluded or None)
        for attempt in range(1, attempts + 1):
            executor.update_parameters(job_name=marker.name)
            try:
                # A job submitted from inside a SLURM job inherits its SLURM_*/SBATCH_* variables, and sbatch
                # reads SBATCH_* as options: members must not get the orchestrator's allocation settings.
                with submitit.helpers.clean_env():
                    if self.config.members_per_task == 1:
                        return executor.map_array(
                            CheckpointableMember(), [entrypoint] * len(part), [s.to_dict() for s in part],
                            [timeout_s] * len(part),
                        )
                    return executor.map_array(
                        PackedMembers(), [entrypoint] * len(packs), [[s.to_dict() for s in p] for p in packs],
                        [timeout_s] * len(packs),
                    )
            except (FailedJobError, FailedSubmissionError, OSError) as exc:
                error = " ".join(str(exc).split())[-500:] or type(exc).__name__
            self._cancel_orphans(marker.name)
            if attempt == attempts:
                raise SubmissionError(
                    f"sbatch of array {marker.name} ({len(part)} member(s)) failed {attempts} time(s) "
                    f"(launcher.submit_attempts={attempts}); last error: {error}"
                    + (f"; its members may not run on node(s) {excluded} (a failed pre-flight or "
                       "launcher.sbatch_extra.exclude), which may leave no node that can take them" if excluded else "")
                )
            delay = self.config.submit_backoff_s * 2 ** (attempt - 1)
            logger.warning("sbatch of array %s failed (try %d/%d): %s; retrying in %g s",
                           marker.name, attempt, attempts, error, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _nodes_to_exclude(self, part: Sequence[MemberSpec]) -> str:
        """``sbatch --exclude`` of one array: the nodes any of its members failed a pre-flight on, plus those of
        launcher.sbatch_extra.exclude (one array holds one option for all its tasks)."""
        nodes = set(filter(None, str(self.config.sbatch_extra.get("exclude") or "").split(",")))
        for spec in part:
            nodes |= self._excluded.get(spec.work_dir, set())
        return ",".join(sorted(nodes))

    def _preflight_failure(self, ref: JobRef) -> dict[str, Any] | None:
        """The pre-flight failure the member of ``ref`` left in its work dir ({host, cause}), if it left one."""
        return read_node_failure(ref.work_dir) if ref.work_dir else None

    def _cancel_orphans(self, name: str) -> None:
        try:
            orphans = self.queries.squeue_by_name([name]).get(name, set())
            if orphans:
                logger.warning("sbatch reported a failure but array %s is queued (%d task(s)); cancelling it",
                               name, len(orphans))
                self.queries.scancel({base_job_id(j) for j in orphans})
        except SlurmQueryError as exc:
            logger.warning("could not check for a half-submitted array %s: %s", name, exc)

    # ------------------------------------------------------------ recover
    def recover(self, queued: Sequence[tuple[MemberSpec, int]], folder: Path) -> dict[int, JobRef]:
        """Re-attach members whose chunk was submitted by an earlier process that died (or whose sbatch
        failed later on) before recording it in jobs.json: the marker maps array task -> member; a marker
        without a job id is looked up by name with ONE squeue call for all of them."""
        markers = read_markers(folder)
        if not markers or not queued:
            return {}
        found: dict[int, tuple[ChunkMarker, int, int]] = {}  # member index -> (marker, its position, submission)
        for spec, recorded in queued:
            best: tuple[ChunkMarker, int, int] | None = None
            for marker in markers:
                for position, (index, attempt, submission) in enumerate(marker.members):
                    if index == spec.index and attempt == spec.attempt and submission > recorded:
                        if best is None or submission >= best[2]:
                            best = (marker, position, submission)
            if best is not None:
                found[spec.index] = best
        if not found:
            return {}
        unnamed = {m.name: m for m, _, _ in found.values() if m.job_id is None}
        live: dict[str, set[str]] = {}
        if unnamed:
            try:
                live = self.queries.squeue_by_name(unnamed)
            except SlurmQueryError as exc:  # submitting blind could run members twice
                raise SubmissionError(f"could not look for arrays submitted before the restart ({exc})") from exc
        refs: dict[int, JobRef] = {}
        orphans: set[str] = set()
        dirs = {spec.index: spec.work_dir for spec, _ in queued}
        for index, (marker, position, submission) in sorted(found.items()):
            task = marker.task_of(position)
            job_id = f"{marker.job_id}_{task}" if marker.job_id is not None else None
            if job_id is None:
                tasks = live.get(marker.name, set())
                bases = {base_job_id(t) for t in tasks}
                if len(bases) != 1:
                    continue  # never queued (or already gone): submit it
                job_id = f"{bases.pop()}_{task}"
                if not _has_pickle(folder, job_id):  # killed between sbatch and submitit's pickle move
                    if job_id in tasks:
                        orphans.add(job_id)
                    continue
            partners = [dirs[i] for k, (i, _, _) in enumerate(marker.members)
                        if marker.task_of(k) == task and i != index and i in dirs]
            refs[index] = JobRef(job_id=job_id, folder=str(folder), attempt=marker.members[position][1],
                                 submissions=submission, work_dir=dirs[index], packed_with=partners)
        for marker in unnamed.values():
            ids = {base_job_id(r.job_id) for i, r in refs.items() if found[i][0] is marker}
            if len(ids) == 1:
                marker.job_id = ids.pop()
                write_marker(folder, marker)
        if orphans:
            logger.warning("cancelling %d queued task(s) that were submitted without their call (%s)",
                           len(orphans), ", ".join(sorted(orphans)[:5]))
            try:
                self.queries.scancel(orphans)
            except SlurmQueryError as exc:
                logger.warning("could not cancel %s: %s", sorted(orphans), exc)
        if refs:
            logger.info("found %d member(s) submitted before the restart but not recorded; re-attaching",
                        len(refs))
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
        if not self._refresh_squeue(self.config.query_interval_s, fresh_after):
            logger.warning("treating job %s as alive for now", job_id)
            return True
        return job_id in self._squeue

    def _refresh_squeue(self, max_age_s: float, fresh_after: float = float("-inf")) -> bool:
        """Ask squeue again when its last answer is older than ``max_age_s`` or than ``fresh_after``;
        False when squeue failed (the last answer, if any, is kept)."""
        now = time.monotonic()
        if self._squeue_at >= fresh_after and now - self._squeue_at < max_age_s:
            return True
        try:
            self._squeue = self.queries.squeue_jobs()
        except SlurmQueryError as exc:
            logger.warning("squeue failed (%s)", exc)
            return False
        self._squeue_at = now
        return True

    def _reason_interval_s(self) -> float:
        """How old the pending reasons may be: a quarter of max_pending_s (so a job that may never start is
        cancelled within 1.25 x max_pending_s), but fresh enough for the queue summary, and never more often
        than query_interval_s: a queue of 180 capped members costs one squeue per 5 min with the defaults."""
        return max(self.config.query_interval_s, min(self.config.max_pending_s / 4, self.queue_log_interval_s))

    def waiting(self, refs: Sequence[JobRef]) -> dict[str, str]:
        """Tasks that sacct last saw queued for a reason (squeue's, the controller's current one) that means
        they may never start (see pending_may_never_start in launch/slurm/queries.py); a job held after a requeue
        (REQUEUE_HOLD) never starts by itself either. Tasks waiting their turn (Priority, Resources, QOS
        limits, this array's own %array_parallelism throttle) are left out. Logs, at most every
        ``queue_log_interval_s`` or when a new reason appears, how many tasks wait and why."""
        stuck: dict[str, str] = {}
        reasons: Counter[tuple[str, bool]] = Counter()
        queued = [(ref, state) for ref in refs
                  if (state := self._state(ref.job_id)) is not None and state.state in QUEUED_STATES]
        if queued:  # the reason comes from squeue (sacct's is stale for pending tasks), refreshed sparingly
            self._refresh_squeue(self._reason_interval_s())
        for ref, state in queued:
            reason = self._squeue.get(ref.job_id) or state.reason or "None"
            never = state.state == "REQUEUE_HOLD" or pending_may_never_start(reason)
            reasons[(reason, never)] += 1
            if never:
                stuck[ref.job_id] = f"{state.state}, {reason}"
        self._log_queue(reasons)
        return stuck

    def _log_queue(self, reasons: Counter[tuple[str, bool]]) -> None:
        now = time.monotonic()
        new_reason = not set(reasons) <= self._reasons_logged
        if not reasons or (not new_reason and now - self._queue_logged_at < self.queue_log_interval_s):
            return
        self._queue_logged_at = now
        self._reasons_logged |= set(reasons)
        turn = ", ".join(f"{n} {r}" for (r, never), n in reasons.most_common() if not never)
        never = ", ".join(f"{n} {r}" for (r, never), n in reasons.most_common() if never)
        parts = [f"{sum(reasons.values())} member task(s) queued"]
        if turn:
            parts.append(f"waiting their turn: {turn}")
        if never:
            parts.append(f"may never start (cancelled after launcher.max_pending_s={self.config.max_pending_s:g} s): "
                         f"{never}")
        (logger.warning if never else logger.info)("; ".join(parts))

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
        if state.state in ("FAILED", "COMPLETED") and (failure := self._preflight_failure(ref)) is not None:
            # a packed task whose other members finished ends COMPLETED, without this member's result
            self._excluded.setdefault(ref.work_dir, set()).add(str(failure["host"]))
            logger.warning("SLURM job %s failed its pre-flight on node %s (%s); resubmitting it without that node",
                           ref.job_id, failure["host"], failure.get("cause"))
            return None  # the node's fault: lost, resubmitted elsewhere, the init not charged
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
        if ref.packed_with:  # a packed task's own stderr is the task's; the member wrote its own log
            path = Path(ref.work_dir) / MEMBER_LOG_FILE
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return ""
        tail = text[-STDERR_TAIL_CHARS:].strip()
        return f"\n--- {path.name} (tail) ---\n{tail}" if tail else ""

    # ------------------------------------------------------------ cancel / close
    def cancel(self, refs: Sequence[JobRef]) -> None:
        """One scancel for all ``refs``; remembered so a resumed run resubmits them rather than giving up. A member of
        a packed task whose partners go on is stopped alone, through a cancel request its task acts on
        (launch/slurm/packed.py); the task is cancelled once none of its members is left to run."""
        refs = self._cancel_packed_members(refs)
        if not refs:
            return
        by_folder: dict[str, set[str]] = {}
        for ref in refs:
            by_folder.setdefault(ref.folder, set()).add(ref.job_id)
        for folder, ids in by_folder.items():
            path = Path(folder)
            atomic_write_json(path / CANCELLED_FILE, sorted(_read_cancelled(path) | ids))
        try:
            self.queries.scancel(sorted({ref.job_id for ref in refs}))
        except SlurmQueryError as exc:
            logger.warning("could not cancel %d job(s): %s", len(refs), exc)

    def _cancel_packed_members(self, refs: Sequence[JobRef]) -> list[JobRef]:
        """Write a cancel request for each packed member whose task still has a member that is not being cancelled
        and has no result; the refs whose whole task can go are returned for scancel."""
        from launch.slurm.packed import write_cancel_request

        stopping = {ref.work_dir for ref in refs}
        whole: list[JobRef] = []
        for ref in refs:
            partners_left = [d for d in ref.packed_with if d not in stopping and read_result(d) is None]
            if not partners_left:
                whole.append(ref)
                continue
            logger.info("stopping the member in %s alone: task %s goes on with %d other member(s)", ref.work_dir,
                        ref.job_id, len(partners_left))
            try:
                write_cancel_request(ref.work_dir, ref.job_id)
            except OSError as exc:
                logger.warning("could not ask task %s to stop the member in %s: %s", ref.job_id, ref.work_dir, exc)
        return whole

    def close(self) -> None:
        logger.info("SLURM launcher made %d scheduler queries (%s)", sum(self.queries.calls.values()),
                    ", ".join(f"{k} {v}" for k, v in sorted(self.queries.calls.items())) or "none")
        super().close()


def _read_cancelled(folder: Path) -> set[str]:
    try:
        return set(json.loads((folder / CANCELLED_FILE).read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return set()


def _has_pickle(folder: Path, job_id: str) -> bool:
    """Whether submitit placed the task's pickled call (done right after sbatch returned)."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id).submitted_pickle.exists()
