"""The scheduler queries the SLURM launcher makes: batched sacct/squeue/scancel calls, parsed, and counted.

Every call goes through one ``SlurmQueries`` object so that the number of scheduler queries is known (the
benchmark reports it, and politeness towards a shared scheduler is a requirement, not a hope). sacct is the
accounting view: it still knows a job after it ended, which squeue does not. A job can be missing from
sacct for a few seconds after submission (accounting lag); callers treat that as "not known yet".
"""
from __future__ import annotations

import getpass
import logging
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

logger = logging.getLogger(__name__)

#: sacct states after which a job (or array task) never runs again unless someone requeues it.
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
     "BOOT_FAIL", "DEADLINE", "REVOKED"}
)

# Pending reasons (sacct Reason / squeue %r), split into the two kinds launcher.max_pending_s cares about.
# This is the ONE place they are listed. "Waiting its turn" never counts against max_pending_s: the job
# starts once others end (a user capped at 32 GPUs has most of 180 members pending with a QOS limit, for
# hours, and that is normal). "May never start" does: no amount of waiting fixes it; someone must change the
# job, the partition, the node or the account.
WAITING_TURN_REASONS = frozenset({
    "None", "", "Priority", "Resources", "Dependency", "BeginTime", "JobArrayTaskLimit", "Licenses",
    "Reservation", "QOSJobLimit", "QOSResourceLimit", "QOSUsageThreshold", "AssocJobLimit",
    "AssocResourceLimit", "AccountingPolicy", "Prolog", "Cleaning", "BurstBufferResources",
    "BurstBufferStageIn", "FedJobLock", "PowerUpNode",
})
NEVER_STARTS_REASONS = frozenset({
    "BadConstraints", "Constraints", "PartitionDown", "PartitionInactive", "PartitionTimeLimit",
    "PartitionNodeLimit", "PartitionConfig", "ReqNodeNotAvail", "NodeDown", "InvalidAccount", "InvalidQOS",
    "QOSNotAllowed", "AccountNotAllowed", "QOSTimeLimit", "AssocTimeLimit", "DependencyNeverSatisfied",
    "JobHeldAdmin", "JobHeldUser", "JobHoldMaxRequeue", "launch failed requeued held", "ReservationDeleted",
    "InvalidReservation",
})
# SLURM has about a hundred QOS/association limit reasons (QOSGrpGRES, AssocGrpGRES, QOSMaxJobsPerUserLimit,
# AssocMaxCpuPerAccount, ...). Limits on a JOB itself (``...PerJob...``, and the ``Min`` ones) cannot be met
# by waiting: the job is too big or too small for its QOS, so it may never start. Aggregate limits (per user,
# account, group) free up as the user's other jobs end: waiting its turn.
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)(Max\w*PerJob\w*|Min\w*)$")
_AGGREGATE_LIMIT = re.compile(r"^(QOS|Assoc)(Grp|Max)\w*$")


def pending_may_never_start(reason: str) -> bool:
    """Whether a pending job's reason means it may never start (counted against launcher.max_pending_s).

    An UNKNOWN reason counts as "may never start": every reason SLURM uses for waiting one's turn (priority,
    resources, begin time, dependencies, every aggregate QOS/association limit) is covered above, so what is
    left is rare, and counting it keeps the promise that every member ends within a bounded time (the
    default limit is hours, and the cancel message names the reason so a misclassification is visible)."""
    text = reason.strip()
    head = text.split(",", 1)[0].strip()  # squeue shows e.g. "ReqNodeNotAvail, UnavailableNodes:n1"
    for candidate in (text, head):
        if candidate in NEVER_STARTS_REASONS:
            return True
        if candidate in WAITING_TURN_REASONS:
            return False
    if _PER_JOB_LIMIT.match(head):
        return True
    if _AGGREGATE_LIMIT.match(head):
        return False
    return True


_RANGE_ROW = re.compile(r"^(?P<base>\d+)_\[(?P<ranges>[0-9,\-]+)(?:%\d+)?\]$")


class SlurmQueryError(RuntimeError):
    """A SLURM client command failed; the message carries its stderr."""


@dataclass(frozen=True)
class TaskState:
    """The accounting state of one job or array task (the latest run of a requeued job)."""

    job_id: str
    state: str
    exit_code: str
    reason: str = ""  # why a pending job waits (e.g. ReqNodeNotAvail, JobArrayTaskLimit); "None" otherwise

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def base_job_id(job_id: str) -> str:
    """``"123_4"`` -> ``"123"``: the id sacct accepts to report a whole array at once."""
    return job_id.split("_", 1)[0]


def expand_job_ids(raw: str) -> list[str]:
    """sacct/squeue job ids, one per task: ``123``, ``123_4``, and pending ranges ``123_[0-3,7%2]``."""
    match = _RANGE_ROW.match(raw)
    if match is None:
        return [raw]
    ids = []
    for part in match.group("ranges").split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        for index in range(int(first), int(last or first) + 1):
            ids.append(f"{match.group('base')}_{index}")
    return ids


def parse_sacct(text: str) -> dict[str, TaskState]:
    """Parse ``sacct -X -n -P -o JobID,State,ExitCode[,Reason]``; ``CANCELLED by 0`` becomes CANCELLED."""
    states: dict[str, TaskState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 3:
            raise SlurmQueryError(f"unexpected sacct line {line!r} (wanted JobID|State|ExitCode)")
        raw_id, state, exit_code = fields[0].strip(), fields[1].strip(), fields[2].strip()
        reason = fields[3].strip() if len(fields) > 3 else ""
        if not raw_id or "." in raw_id:  # job steps (123.batch) are not jobs
            continue
        for job_id in expand_job_ids(raw_id):
            states[job_id] = TaskState(job_id, state.split()[0] if state else "UNKNOWN", exit_code, reason)
    return states


class SlurmQueries:
    """Runs SLURM client commands with a timeout and counts them by command name."""

    def __init__(self, command_timeout_s: float = 60.0) -> None:
        self.command_timeout_s = command_timeout_s
        self.calls: Counter[str] = Counter()

    def run(self, args: Sequence[str]) -> str:
        self.calls[args[0]] += 1
        try:
            proc = subprocess.run(
                list(args), capture_output=True, text=True, timeout=self.command_timeout_s, check=False
            )
        except FileNotFoundError as exc:
            raise SlurmQueryError(f"`{args[0]}` is not installed (is this a SLURM login node?)") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmQueryError(f"{' '.join(args)} timed out after {self.command_timeout_s:.0f} s") from exc
        if proc.returncode != 0:
            raise SlurmQueryError(
                f"{' '.join(args)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-1000:]}"
            )
        return proc.stdout

    def sacct(self, job_ids: Iterable[str]) -> dict[str, TaskState]:
        """One sacct call for all given jobs (array ids report every task)."""
        ids = sorted({base_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}
        fields = "JobID,State,ExitCode,Reason"
        return parse_sacct(self.run(["sacct", "-X", "-n", "-P", "-o", fields, "-j", ",".join(ids)]))

    def squeue_jobs(self) -> dict[str, str]:
        """This user's queued or running jobs and array tasks, each with the controller's CURRENT pending
        reason ("None" when running). One call; squeue errors on unknown ids, so it is asked for the user's
        whole queue instead of a list of ids. The reason must come from here: sacct keeps the reason of the
        last accounting update, which for a pending array task stays "None" while the controller says
        QOSMaxJobsPerUserLimit, PartitionDown, ... (seen on the local cluster, SLURM 22.05)."""
        out = self.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%r"])
        jobs: dict[str, str] = {}
        for line in out.splitlines():
            raw_id, _, reason = line.strip().partition("|")
            if raw_id:
                for job_id in expand_job_ids(raw_id):
                    jobs[job_id] = reason.strip()
        return jobs

    def squeue_by_name(self, names: Iterable[str]) -> dict[str, set[str]]:
        """This user's queued or running array tasks whose job name is one of ``names``, by name (ONE
        squeue call). It finds jobs whose ids were never recorded (a crash between sbatch and the record);
        squeue is used rather than sacct because accounting lags seconds behind sbatch, and a job that
        already ended is not worth re-attaching to (its member is settled from its result file)."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        out = self.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-n", ",".join(wanted), "-o", "%i|%j"])
        found: dict[str, set[str]] = {}
        for line in out.splitlines():
            raw_id, sep, name = line.strip().partition("|")
            if sep and name in wanted:
                found.setdefault(name, set()).update(expand_job_ids(raw_id))
        return found

    def scancel(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        if ids:
            self.run(["scancel", *ids])

    def max_array_size(self) -> int:
        """The cluster's MaxArraySize: one array may use task indices 0 .. MaxArraySize-1."""
        text = self.run(["scontrol", "show", "config"])
        match = re.search(r"^MaxArraySize\s*=\s*(\d+)", text, re.MULTILINE)
        if match is None:
            raise SlurmQueryError("`scontrol show config` reports no MaxArraySize; set launcher.max_array_size")
        return int(match.group(1))
