"""Smoke tests of the local SLURM cluster itself (scripts/local_slurm/up.sh).

The slurm launcher's tests rely on these behaviours of the cluster: arrays run in parallel and finish
COMPLETED in accounting, scancel and the time limit are visible in sacct, an array beyond MaxArraySize is
refused (array splitting is tested against that), and a requeued job runs again with both runs in
`sacct -D`. The time-limit job is submitted before the other tests run, because SLURM enforces `--time`
with minute granularity and a 30 s check interval; the other tests overlap that wait.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from slurm_helpers import (
    SQUEUE_FORMAT,
    JobRow,
    LocalSlurm,
    SlurmCommandError,
    abandoned_test_jobs,
    run_slurm_command,
)

# up.sh's default; the array-splitting tests need a limit small enough to exceed cheaply.
EXPECTED_MAX_ARRAY_SIZE = 50


def _states(rows: list[JobRow]) -> list[str]:
    return [r.state for r in rows]


@pytest.fixture(scope="module", autouse=True)
def time_limit_job(slurm_cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, float]:
    """A 1-minute-limit job that would otherwise sleep 10 minutes, submitted before any test of this module
    (autouse) so that the other tests' runtime overlaps its wait."""
    workdir = tmp_path_factory.mktemp("time_limit")
    job_id = slurm_cluster.sbatch("--time=1", "--job-name=mirror-es-timeout", wrap="sleep 600", workdir=workdir)
    return job_id, time.monotonic()


def test_array_tasks_all_complete_and_run_in_parallel(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    job_id = slurm_cluster.sbatch(
        "--array=0-3", "--cpus-per-task=1",
        wrap='sleep 3; echo "$SLURM_ARRAY_TASK_ID" > task_$SLURM_ARRAY_TASK_ID.txt', workdir=tmp_path,
    )
    rows = slurm_cluster.wait_terminal([job_id], expected_tasks=4, timeout=60)

    assert sorted(r.job_id for r in rows) == [f"{job_id}_{i}" for i in range(4)]
    assert _states(rows) == ["COMPLETED"] * 4, rows
    assert all(r.exit_code == "0:0" for r in rows), rows
    for i in range(4):
        assert (tmp_path / f"task_{i}.txt").read_text().strip() == str(i)
    # DefMemPerCPU keeps one task from claiming the node's memory: all four must overlap in time.
    assert max(r.start for r in rows) < min(r.end for r in rows), f"array tasks ran one after another: {rows}"


def test_scancel_of_running_job_shows_cancelled(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    job_id = slurm_cluster.sbatch(wrap="sleep 300", workdir=tmp_path)
    slurm_cluster.wait_for([job_id], lambda rows: _states(rows) == ["RUNNING"], timeout=30, what="RUNNING")

    run_slurm_command(["scancel", str(job_id)])
    rows = slurm_cluster.wait_for([job_id], lambda rows: _states(rows) == ["CANCELLED"], timeout=30,
                                  what="CANCELLED")
    assert rows[0].end != "Unknown"


def test_array_larger_than_max_array_size_is_refused(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    limit = slurm_cluster.max_array_size
    assert limit <= EXPECTED_MAX_ARRAY_SIZE, f"MaxArraySize={limit}; up.sh should configure a small one"

    with pytest.raises(SlurmCommandError, match="Invalid job array specification"):
        slurm_cluster.sbatch(f"--array=0-{2 * limit - 1}", wrap="true", workdir=tmp_path)
    # Indices up to MaxArraySize-1 are the most one array may hold: that is accepted (held, then dropped).
    job_id = slurm_cluster.sbatch(f"--array=0-{limit - 1}", "--hold", wrap="true", workdir=tmp_path)
    run_slurm_command(["scancel", str(job_id)])


@pytest.mark.slow
def test_requeue_of_running_job_runs_it_again(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    starts = tmp_path / "starts.txt"
    job_id = slurm_cluster.sbatch(
        "--requeue", wrap=f'echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {starts}; sleep 300', workdir=tmp_path
    )
    slurm_cluster.wait_for([job_id], lambda rows: _states(rows) == ["RUNNING"], timeout=30, what="RUNNING")
    run_slurm_command(["scontrol", "requeue", str(job_id)])
    # The cluster's cred_expire (20 s) is how long a requeued job waits before it may start again.
    rows = slurm_cluster.wait_for(
        [job_id], lambda rows: _states(rows) == ["REQUEUED", "RUNNING"], timeout=60,
        what="requeued and running again", duplicates=True,
    )
    assert all(r.job_id == str(job_id) for r in rows), rows
    slurm_cluster.wait_for([job_id], lambda _rows: len(starts.read_text().splitlines()) == 2, timeout=15,
                           what="started twice")
    assert starts.read_text().splitlines() == ["restart=0", "restart=1"]
    run_slurm_command(["scancel", str(job_id)])


@pytest.mark.slow
def test_job_past_its_time_limit_shows_timeout(
    slurm_cluster: LocalSlurm, time_limit_job: tuple[int, float]
) -> None:
    job_id, submitted_at = time_limit_job
    # --time=1 is one minute; slurmctld checks limits every 30 s, then KillWait=2 s.
    remaining = 150 - (time.monotonic() - submitted_at)
    rows = slurm_cluster.wait_for([job_id], lambda rows: _states(rows) == ["TIMEOUT"], timeout=remaining,
                                  what="TIMEOUT", interval=2.0)
    assert time.monotonic() - submitted_at >= 60, "the job ended before its one-minute limit"
    assert rows[0].end != "Unknown"


def test_a_held_job_an_interrupted_test_session_left_is_cancelled_and_nothing_else(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    """A killed pytest leaves its held job PENDING forever; the next session must not wait on it (CI did, 600 s)."""
    own_session, earlier_session = tmp_path / "own", tmp_path / "earlier"  # both under a pytest-of-<user> root
    own_session.mkdir()
    earlier_session.mkdir()
    with tempfile.TemporaryDirectory() as not_a_test:
        held_by_earlier = slurm_cluster.sbatch("--hold", wrap="true", workdir=earlier_session)
        held_elsewhere = slurm_cluster.sbatch("--hold", wrap="true", workdir=Path(not_a_test))
        held_here = slurm_cluster.sbatch("--hold", wrap="true", workdir=own_session)
        ours = {held_by_earlier, held_elsewhere, held_here}
        try:
            lines = [line for line in run_slurm_command(["squeue", "-h", "-o", SQUEUE_FORMAT]).splitlines()
                     if int(line.split("|")[0]) in ours]
            assert len(lines) == 3, lines
            assert abandoned_test_jobs(lines, own_session) == [str(held_by_earlier)]
            # the same job running (or queued for resources) may be a live session's: it is waited for
            running = [line.replace("|PENDING|JobHeldUser|", "|RUNNING|None|") for line in lines]
            assert abandoned_test_jobs(running, own_session) == []
        finally:
            run_slurm_command(["scancel", *map(str, ours)])
