"""launcher.max_pending_s counts only pending reasons that mean a job may never start (no cluster needed).

Jobs waiting their turn (Priority, Resources, QOS/association limits) must never be cancelled: a user capped
at 32 GPUs has most of a 180-member generation pending with QOSMaxJobsPerUserLimit for hours. The same on
the real local cluster, with a real QOS limit and a real DOWN partition: tests/slurm/test_slurm_queue_reasons.py.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from launch.base import JobRef
from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from launch.slurm.queries import TaskState, pending_may_never_start
from core.records import MemberSpec

WAITING_TURN = ["Priority", "Resources", "QOSMaxJobsPerUserLimit", "QOSGrpGRES", "AssocGrpGRES",
                "JobArrayTaskLimit", "BeginTime", "Dependency", "None", "", "AssocMaxJobsLimit",
                "QOSGrpCpuLimit", "QOSMaxGRESPerUser"]
NEVER_STARTS = ["BadConstraints", "PartitionDown", "PartitionTimeLimit", "ReqNodeNotAvail",
                "ReqNodeNotAvail, UnavailableNodes:node7", "InvalidAccount", "InvalidQOS", "JobHeldAdmin",
                "QOSMaxWallDurationPerJobLimit", "AssocMaxNodesPerJobLimit", "QOSMinGRES", "NodeDown",
                "launch failed requeued held"]


@pytest.mark.parametrize("reason", WAITING_TURN)
def test_waiting_ones_turn_never_counts(reason: str) -> None:
    assert not pending_may_never_start(reason)


@pytest.mark.parametrize("reason", NEVER_STARTS)
def test_reasons_that_may_never_start_count(reason: str) -> None:
    assert pending_may_never_start(reason)


def test_an_unknown_reason_counts_so_the_wait_stays_bounded() -> None:
    assert pending_may_never_start("SomeReasonSlurm27Invented")


def _launcher_with(states: dict[str, tuple[str, str]]) -> SlurmLauncher:
    """sacct says each task's state (with the stale reason "None" it really shows for pending array tasks);
    squeue, stubbed here, has the controller's reason."""
    launcher = SlurmLauncher(max_pending_s=5)
    launcher._states = {j: TaskState(j, state, "0:0", "None") for j, (state, _) in states.items()}
    launcher.squeue_answer = {j: reason for j, (_, reason) in states.items()}  # type: ignore[attr-defined]
    launcher.squeue_calls = 0  # type: ignore[attr-defined]

    def squeue_jobs() -> dict[str, str]:
        launcher.squeue_calls += 1  # type: ignore[attr-defined]
        return dict(launcher.squeue_answer)  # type: ignore[attr-defined]

    launcher.queries.squeue_jobs = squeue_jobs  # type: ignore[method-assign]
    return launcher


def _refs(ids: list[str]) -> list[JobRef]:
    return [JobRef(job_id=j, folder="/nowhere") for j in ids]


def test_waiting_names_only_jobs_that_may_never_start(caplog: pytest.LogCaptureFixture) -> None:
    states = {f"9_{k}": ("PENDING", "QOSMaxJobsPerUserLimit") for k in range(148)}
    states.update({"9_148": ("PENDING", "Priority"), "9_149": ("RUNNING", "None"),
                   "9_150": ("PENDING", "PartitionDown"), "9_151": ("REQUEUE_HOLD", "None")})
    launcher = _launcher_with(states)
    with caplog.at_level(logging.INFO, logger="launch.slurm.launcher"):
        stuck = launcher.waiting(_refs(sorted(states)))
    assert stuck == {"9_150": "PENDING, PartitionDown", "9_151": "REQUEUE_HOLD, None"}
    summary = [r.getMessage() for r in caplog.records]
    assert len(summary) == 1, summary
    assert "151 member task(s) queued" in summary[0] and "148 QOSMaxJobsPerUserLimit" in summary[0], summary
    assert "1 PartitionDown" in summary[0] and "max_pending_s=5" in summary[0], summary


def test_the_queue_summary_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    launcher = _launcher_with({"9_0": ("PENDING", "Priority"), "9_1": ("PENDING", "Resources")})
    with caplog.at_level(logging.INFO, logger="launch.slurm.launcher"):
        for _ in range(50):  # 50 poll rounds
            launcher.waiting(_refs(["9_0", "9_1"]))
        assert len(caplog.records) == 1
        assert launcher.squeue_calls == 1  # reasons are not asked for every poll either
        launcher.squeue_answer["9_1"] = "BadConstraints"  # type: ignore[attr-defined]
        launcher._squeue_at -= launcher._reason_interval_s()  # the reasons are due again
        launcher.waiting(_refs(["9_0", "9_1"]))
        assert launcher.squeue_calls == 2
        assert len(caplog.records) == 2 and "BadConstraints" in caplog.records[-1].getMessage()  # new: at once
        launcher._queue_logged_at -= launcher.queue_log_interval_s  # the interval passed
        launcher.waiting(_refs(["9_0", "9_1"]))
        assert len(caplog.records) == 3


def test_reasons_are_asked_of_squeue_only_while_tasks_are_queued() -> None:
    launcher = _launcher_with({"9_0": ("RUNNING", "None"), "9_1": ("COMPLETED", "None")})
    assert launcher.waiting(_refs(["9_0", "9_1"])) == {}
    assert launcher.squeue_calls == 0
    assert SlurmLauncher(max_pending_s=21600)._reason_interval_s() == 300.0  # defaults: one squeue per 5 min


def test_runner_keeps_jobs_pending_on_a_qos_limit_past_max_pending_s(tmp_path: Path) -> None:
    """The runner with the SLURM launcher's answers: a QOS-capped task is never cancelled, a task in a
    DOWN partition is, with a message naming the reason."""
    launcher = _launcher_with({"9_0": ("PENDING", "QOSMaxJobsPerUserLimit"), "9_1": ("PENDING", "PartitionDown")})
    cancelled: list[str] = []
    launcher.cancel = lambda refs: cancelled.extend(r.job_id for r in refs)  # type: ignore[method-assign]
    specs = [MemberSpec(run_id="r", generation=0, index=i, seed=0, params=[0.0], work_dir=str(tmp_path / f"m{i}"))
             for i in range(2)]
    runner = MemberArrayRunner(launcher, "x:y", specs, {}, lambda jobs: None, tmp_path,
                               RunnerPolicy(retries=0, max_pending_s=0.0))
    runner.in_flight = {0: JobRef("9_0", str(tmp_path)), 1: JobRef("9_1", str(tmp_path))}
    runner._enforce_queue_limit()  # first sight starts the clock
    time.sleep(0.01)
    runner._enforce_queue_limit()
    assert cancelled == ["9_1"]
    assert list(runner.in_flight) == [0]
    error = runner.final[1].error
    assert runner.final[1].status == "timeout" and "PartitionDown" in error and "max_pending_s=0" in error, error
