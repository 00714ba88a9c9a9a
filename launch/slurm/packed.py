"""A packed SLURM array task: k members (``resources.members_per_gpu``) on one GPU, each in its own process.

Why: GPU-hours are what a search costs, and two mbpp_qwen3 members sharing a card produce ~1.7x the tokens of one;
SLURM's own GPU sharing (shards, MPS) needs the site's administrators, so a task that holds one GPU runs k members
itself. Each member keeps everything it has alone: its work dir, record, running-time ledger, seed and log
(``<work_dir>/MEMBER_LOG_FILE``), and its own process (``python -m launch.slurm.packed`` running ``run_member``), so
a member's failure, out-of-memory or timeout ends that member alone:

- a member process that ends without a result (a crash, a SIGKILL, the kernel's out-of-memory killer) is recorded
  ``failed`` here, naming how it ended and its log; its partners go on;
- the scheduler's notices (SIGTERM of a requeue or preemption, submitit's USR2 before the time limit) are passed to
  every member still running, each saves a checkpoint at the end of its step (inner_loop/process/notice.py) and stops; once
  they have, the task does what it would have done (submitit requeues the same call on USR2). The requeued task
  starts only the members without a final result, and each resumes from its own checkpoint;
- one member is stopped alone (a quorum close, an early stop, its wall limit) through a CANCEL_REQUEST_FILE in its
  work dir naming this task (launch/slurm/launcher.py writes it): its process group is killed, the orchestrator
  records the decision, and the task ends when its last member ends;
- a member whose node failed its pre-flight leaves no result (the launcher resubmits it elsewhere).

Light on purpose (no torch): it runs in every packed task.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import submitit
from submitit.core.utils import UncompletedJobError

from launch.member import requeue_cut_short, run_member
from results.store.atomic import atomic_write_json
from results.store.gpu_share import write_gpu_share
from results.store.layout import CANCEL_REQUEST_FILE, MEMBER_LOG_FILE
from core.keys import MEMBERS_ON_GPU_ENV
from results.store.node_failure import read_node_failure
from core.notice_window import task_grace_s
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result, write_result_if_absent

logger = logging.getLogger(__name__)

#: how often the task looks at its members' processes and cancel requests
POLL_S = 0.5
#: the scheduler's notices of a job's end that a member saves a checkpoint on (the same as inner_loop/process/notice.py's):
#: SLURM's SIGTERM (requeue, preemption, cancel) and submitit's time-limit USR2
TASK_NOTICES = (signal.SIGTERM, signal.SIGUSR2)
LOG_TAIL_CHARS = 1500


def task_id() -> str:
    """This array task's SLURM id as sacct and the launcher name it: ``<array job>_<task>`` (else the job id)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", f"pid{os.getpid()}")


def write_cancel_request(work_dir: str | Path, task: str) -> None:
    """Ask the packed task ``task`` to stop the member of ``work_dir`` (and only it)."""
    atomic_write_json(Path(work_dir) / CANCEL_REQUEST_FILE, {"task": str(task), "time": time.time()})


def cancel_requested(work_dir: str | Path, task: str) -> bool:
    """Whether the member of ``work_dir`` was asked to stop in task ``task`` (a request for an earlier task of the
    same member, e.g. before an abort and a resume, does not stop a later one)."""
    try:
        return json.loads((Path(work_dir) / CANCEL_REQUEST_FILE).read_text()).get("task") == str(task)
    except (OSError, ValueError, AttributeError):
        return False


@dataclass
class _Running:
    spec: MemberSpec
    process: subprocess.Popen
    log: Any
    cancelled: bool = False


@dataclass
class PackedTask:
    """The members of one task and what happened to them; ``run`` drives them to their ends."""

    entrypoint: str
    specs: list[MemberSpec]
    timeout_s: float
    task: str = field(default_factory=task_id)
    notice_signal: int | None = None
    running: list[_Running] = field(default_factory=list)

    def run(self) -> list[dict[str, Any] | None]:
        """Start every member without a final result, wait for all, and return each member's record (None for one
        stopped by a notice, a cancel request or its node's pre-flight: not final here)."""
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        to_run = []
        for spec in self.specs:
            if read_result(spec.work_dir) is not None:
                logger.info("member %s already has its result; not run again", spec.work_dir)
            elif cancel_requested(spec.work_dir, self.task):
                logger.info("member %s was stopped before this task started it", spec.work_dir)
            else:
                to_run.append(spec)
        # the card is shared by the members this run starts (a requeued task's survivors, an odd member alone): each
        # takes its part of the card among them, and is charged for that part (gpu_share.json names its partners)
        indices = [s.index for s in to_run]
        for spec in to_run:
            write_gpu_share(spec.work_dir, self.task, gpus, [i for i in indices if i != spec.index], len(self.specs))
            self.running.append(self._start(spec, present=len(to_run)))
        logger.info("task %s runs %d of its %d member(s) on GPU(s) %r", self.task, len(self.running),
                    len(self.specs), gpus)
        notice_at: float | None = None
        while any(r.process.poll() is None for r in self.running):
            if self.notice_signal is not None and notice_at is None:
                notice_at = time.monotonic()
            # after a notice, members get their own window to save and stop (the one number they wait by:
            # core/notice_window.py), then are killed
            if (notice_at is not None and self.notice_signal is not None
                    and time.monotonic() - notice_at > task_grace_s(self.notice_signal)):
                for member in self.running:
                    _kill_group(member.process, signal.SIGKILL)
            for member in self.running:
                if member.process.poll() is None and not member.cancelled and cancel_requested(
                        member.spec.work_dir, self.task):
                    logger.warning("member %s: stopped on request (its partners go on)", member.spec.work_dir)
                    member.cancelled = True
                    _kill_group(member.process, signal.SIGKILL)
            time.sleep(POLL_S)
        for member in self.running:
            member.log.close()
            self._conclude(member)
        return [_record_dict(spec) for spec in self.specs]

    def on_notice(self, signum: int, frame: Any) -> None:
        """Pass the scheduler's notice to every member still running (each saves at the end of its step); the loop
        in ``run`` waits for them, then the notice is handed on (``_hand_on``)."""
        if self.notice_signal is None:
            logger.warning("%s: passing the notice to the task's %d running member(s)", signal.Signals(signum).name,
                           sum(r.process.poll() is None for r in self.running))
        self.notice_signal = signum
        for member in self.running:
            if member.process.poll() is None:
                _kill_group(member.process, signum)

    def _start(self, spec: MemberSpec, present: int) -> _Running:
        log = open(Path(spec.work_dir) / MEMBER_LOG_FILE, "a", buffering=1)
        log.write(f"--- task {self.task} starts member {spec.index} (attempt {spec.attempt}) at {time.ctime()}\n")
        process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, text=True, preexec_fn=_die_with_task if sys.platform == "linux" else None,
            env={**os.environ, MEMBERS_ON_GPU_ENV: str(present)},
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps({"entrypoint": self.entrypoint, "spec": spec.to_dict(),
                                        "timeout_s": self.timeout_s}))
        process.stdin.close()
        return _Running(spec=spec, process=process, log=log)

    def _conclude(self, member: _Running) -> None:
        """A member process that ended without a result, for none of the reasons that leave it unfinished on
        purpose, is recorded failed (its partners are unaffected)."""
        spec, code = member.spec, member.process.returncode
        if read_result(spec.work_dir) is not None or member.cancelled or self.notice_signal is not None:
            return
        if read_node_failure(spec.work_dir) is not None:
            return  # the node's fault: the launcher resubmits the member elsewhere, the init not charged
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}")
        if code == -signal.SIGKILL:
            how += " (the kernel's out-of-memory killer, or a kill from outside)"
        log_path = Path(spec.work_dir) / MEMBER_LOG_FILE
        write_result_if_absent(spec.work_dir, ResultRecord(status="failed", error=(
            f"member process {how} without a result in packed task {self.task}, whose other members went on; "
            f"its log {log_path}:\n{_tail(log_path)}")))


def _die_with_task() -> None:
    """In a member process before it starts: die with the task's process (Linux PR_SET_PDEATHSIG). A task killed from
    outside (its node's out-of-memory killer, a hard kill) must not leave a member training on the GPU, outside the
    scheduler's sight (a member runs in a session of its own, which a scheduler tracking process trees can lose)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _kill_group(process: subprocess.Popen, signum: int) -> None:
    """Signal a member process and everything it started (its own session: the sandbox workers, a pinned child)."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _record_dict(spec: MemberSpec) -> dict[str, Any] | None:
    record = read_result(spec.work_dir)
    return record.to_dict() if record is not None else None


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(unreadable)"


def run_packed(entrypoint: str, specs: Sequence[Mapping[str, Any]], timeout_s: float) -> list[dict[str, Any] | None]:
    """Run a packed task's members (see the module docstring); main thread of the task's process."""
    task = PackedTask(entrypoint, [MemberSpec.from_dict(s) for s in specs], timeout_s)
    previous = {signum: signal.signal(signum, task.on_notice) for signum in TASK_NOTICES}
    records = task.run()
    if task.notice_signal is not None:
        try:
            _hand_on(task.notice_signal, previous[task.notice_signal])
        except UncompletedJobError as exc:  # no requeue left: the members still unfinished ran out of time
            for spec in task.specs:
                write_result_if_absent(spec.work_dir, ResultRecord(status="timeout", error=str(exc)))
            return [_record_dict(spec) for spec in task.specs]
    return records


def _hand_on(signum: int, previous: Any) -> None:
    """Once the members stopped, do what this process would have done on the notice: submitit's handler (on USR2 it
    requeues this same call and exits), then end with the signal's status, so that the task never looks COMPLETED
    with members unfinished; an ignored signal is ignored."""
    if previous is signal.SIG_IGN:
        return
    if callable(previous):
        try:
            previous(signum, None)
        except subprocess.CalledProcessError as exc:
            if not requeue_cut_short(exc):
                raise
            logger.warning("the task was requeued (%s)", exc)
            raise SystemExit(-1) from None  # as submitit's handler ends once its requeue returned
    raise SystemExit(128 + signum)


class PackedMembers(submitit.helpers.Checkpointable):
    """``PackedMembers()(entrypoint, specs, timeout_s)`` == ``run_packed(...)``; requeued with the same call (the
    requeued task skips members with a final result)."""

    def __call__(self, entrypoint: str, specs: Sequence[Mapping[str, Any]], timeout_s: float
                 ) -> list[dict[str, Any] | None]:
        return run_packed(entrypoint, specs, timeout_s)


def _member_main() -> int:
    """One member of a packed task, in its own process: ``run_member`` as an unpacked task would call it."""
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    call = json.loads(sys.stdin.read())
    run_member(call["entrypoint"], call["spec"], float(call["timeout_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(_member_main())
