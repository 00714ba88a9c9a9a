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

    def squeue_ids(self) -> set[str]:
        """Ids of this user's queued or running jobs and array tasks (one call; squeue errors on unknown
        ids, so it is asked for the user's whole queue instead of a list of ids)."""
        out = self.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i"])
        ids: set[str] = set()
        for line in out.split():
            ids.update(expand_job_ids(line.strip()))
        return ids

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
