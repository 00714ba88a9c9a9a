"""Helpers for tests against the real local SLURM cluster: run client commands, submit, read sacct, wait.

Kept out of conftest.py so test modules can import them by a unique name (several conftest modules may
exist in one pytest session). Waiting always goes through sacct, the accounting view that submitit and
the slurm launcher rely on, and every wait is bounded.
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pytest
from time_limits import scaled

logger = logging.getLogger(__name__)

# sacct states after which a job (or array task) never runs again on its own.
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
     "BOOT_FAIL", "DEADLINE"}
)
COMMAND_TIMEOUT_S = scaled(20.0)


@dataclass(frozen=True)
class JobRow:
    """One sacct line: a job, an array task (`12_3`) or, with duplicates, one earlier run of a requeued job."""

    job_id: str
    state: str
    exit_code: str
    start: str
    end: str


class SlurmCommandError(RuntimeError):
    """A slurm client command failed; carries its stderr so the test failure says why."""


def run_slurm_command(args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run a slurm client command and return stdout; raise SlurmCommandError with stderr on failure."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(f"{' '.join(args)} timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise SlurmCommandError(
            f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def parse_sacct(text: str) -> list[JobRow]:
    """Parse `sacct -n -P -o JobID,State,ExitCode,Start,End` output; `CANCELLED by 0` becomes CANCELLED."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, exit_code, start, end = line.split("|")
        rows.append(JobRow(job_id, state.split()[0] if state else "", exit_code, start, end))
    return rows


@dataclass
class LocalSlurm:
    """Handle on the running test cluster: its facts plus submit / query / wait helpers for tests."""

    node: str
    cpus: int
    max_array_size: int
    submitted: list[int] = field(default_factory=list)

    def sbatch(self, *options: str, wrap: str, workdir: Path) -> int:
        """Submit `wrap` as a batch job (output in workdir) and return its job id."""
        out = run_slurm_command(
            ["sbatch", "--parsable", f"--chdir={workdir}", f"--output={workdir}/slurm-%A_%a.out",
             *options, "--wrap", wrap]
        )
        job_id = int(out.strip().split(";")[0])
        self.submitted.append(job_id)
        return job_id

    def sacct(self, job_ids: Iterable[int], duplicates: bool = False) -> list[JobRow]:
        """Allocation rows of the given jobs (one batched sacct call); with duplicates, requeued runs too."""
        ids = ",".join(str(j) for j in job_ids)
        args = ["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State,ExitCode,Start,End"]
        if duplicates:
            args.append("-D")
        return parse_sacct(run_slurm_command(args))

    def wait_for(
        self,
        job_ids: Iterable[int],
        done: Callable[[list[JobRow]], bool],
        timeout: float,
        what: str,
        duplicates: bool = False,
        interval: float = 0.5,
    ) -> list[JobRow]:
        """Poll sacct until `done(rows)`; fail the test with the last rows seen after `timeout` seconds."""
        ids = list(job_ids)
        deadline = time.monotonic() + scaled(timeout)
        rows: list[JobRow] = []
        while True:
            rows = self.sacct(ids, duplicates=duplicates)
            if done(rows):
                return rows
            if time.monotonic() > deadline:
                pytest.fail(f"jobs {ids}: not {what} within {scaled(timeout):.0f} s; sacct shows {rows}")
            time.sleep(interval)

    def wait_terminal(self, job_ids: Iterable[int], expected_tasks: int, timeout: float) -> list[JobRow]:
        """Wait until `expected_tasks` rows exist and all are in a terminal state."""
        return self.wait_for(
            job_ids,
            lambda rows: len(rows) == expected_tasks and all(r.state in TERMINAL_STATES for r in rows),
            timeout,
            what=f"finished ({expected_tasks} tasks)",
        )

    def cancel_leftovers(self) -> None:
        """Cancel every job this session submitted that is still queued or running, so no test leaks load.

        Asks the controller (squeue), not accounting: sacct may not list a job submitted a second ago yet."""
        if not self.submitted:
            return
        try:
            queued = {line.strip() for line in run_slurm_command(["squeue", "-h", "-o", "%F"]).splitlines()}
            live = queued & {str(job_id) for job_id in self.submitted}
            if live:
                run_slurm_command(["scancel", *sorted(live)])
        except SlurmCommandError as exc:
            logger.warning("could not cancel leftover test jobs: %s", exc)


# Pending reasons after which a job never starts on its own: someone must release or cancel it.
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
# pytest's temporary directories are /tmp/pytest-of-<user>/pytest-<n>/...: a job working in one was a test's.
PYTEST_TMP_MARK = "/pytest-of-"
SQUEUE_FORMAT = "%i|%j|%T|%r|%Z"


def abandoned_test_jobs(squeue_lines: Iterable[str], own_tmp_root: Path) -> list[str]:
    """Job ids an interrupted earlier test session left held in the queue (`squeue -o SQUEUE_FORMAT` lines).

    A test that holds a job cancels it before it ends; when its pytest was killed first, the held job stays
    PENDING forever (across cluster restarts) and every later session would wait its whole busy timeout for
    it. Only held jobs working in another pytest session's temporary directory qualify: a running or
    merely queued job may belong to a live session or to someone else and is waited for instead."""
    own = str(own_tmp_root.resolve())
    abandoned = []
    for line in squeue_lines:
        job_id, _name, state, reason, workdir = line.split("|", 4)
        if (state == "PENDING" and reason in HELD_REASONS and PYTEST_TMP_MARK in workdir
                and not (workdir == own or workdir.startswith(own + "/"))):
            abandoned.append(job_id)
    return abandoned


def wait_until_queue_empty(timeout: float, own_tmp_root: Path, interval: float = 5.0) -> None:
    """Wait for jobs already in the queue (a benchmark, an interrupted run's leftovers) to end.

    The tests size their waits for a node of their own; started next to someone else's array they would
    time out with a confusing PENDING. Held jobs abandoned by an interrupted test session are cancelled
    (they would never end). Raise SlurmCommandError naming the jobs after `timeout` seconds."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        queued = run_slurm_command(["squeue", "-h", "-o", SQUEUE_FORMAT]).splitlines()
        abandoned = abandoned_test_jobs(queued, own_tmp_root)
        if abandoned:
            logger.warning("cancelling %d held job(s) an interrupted test session left in the queue: %s",
                           len(abandoned), abandoned)
            run_slurm_command(["scancel", *abandoned])
            continue
        if not queued:
            return
        if time.monotonic() > deadline:
            raise SlurmCommandError(
                f"the cluster is busy with {len(queued)} job(s) not started by these tests after waiting "
                f"{timeout:.0f} s (first: {queued[:3]}); cancel them with scancel or wait"
            )
        logger.warning("waiting for %d queued job(s) of others to end before the SLURM tests: %s",
                       len(queued), queued[:3])
        time.sleep(interval)


def _config_value(config_text: str, key: str) -> str:
    match = re.search(rf"^{key}\s*=\s*(\S+)", config_text, re.MULTILINE)
    if match is None:
        raise SlurmCommandError(f"`scontrol show config` has no {key}")
    return match.group(1)


def probe_cluster() -> LocalSlurm:
    """Check that the cluster answers (sinfo, sacct) with a usable node; raise SlurmCommandError why not."""
    for tool in ("sinfo", "sacct", "sbatch", "scontrol", "scancel"):
        if shutil.which(tool) is None:
            raise SlurmCommandError(f"`{tool}` is not installed")
    nodes = run_slurm_command(["sinfo", "-h", "-N", "-o", "%N|%T|%c"]).split()
    usable = [n.split("|") for n in nodes if n.split("|")[1] in {"idle", "mixed", "allocated"}]
    if not usable:
        raise SlurmCommandError(f"no node is idle/mixed/allocated (sinfo: {nodes or 'no nodes'})")
    run_slurm_command(["sacct", "-n", "-X", "-S", "now"])  # fails without slurmdbd accounting
    config = run_slurm_command(["scontrol", "show", "config"])
    node, _state, cpus = usable[0]
    return LocalSlurm(node=node, cpus=int(cpus), max_array_size=int(_config_value(config, "MaxArraySize")))
