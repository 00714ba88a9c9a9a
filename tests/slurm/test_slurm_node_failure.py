"""The node going down or drained mid-job, on the real one-node cluster; each case ends in a bounded time.

What SLURM does here (JobRequeue=1, ReturnToService=2, slurmd still answering): `state=down` kills the
running job, sacct shows NODE_FAIL for a few seconds, then the same job id is PENDING (BeginTime) again;
the node returns to service by itself within seconds and the job restarts ~20 s later, so the member
resumes from its checkpoint. `state=drain` lets the running job finish. A node kept out of service (down,
then drained) leaves the requeued job pending forever: launcher.max_pending_s bounds that wait.
The node is always put back to idle in ``finally``.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from launch.base import JobRef, Launcher
from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from results.store.member_files import read_result
from slurm_helpers import LocalSlurm, run_slurm_command
from slurm_launch_helpers import ENTRY, FAST, Background, specs
from time_limits import scaled


def _checkpoint(work_dir: Path) -> dict:
    try:
        return json.loads((work_dir / "synthetic_ckpt.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"step": 0, "starts": []}


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f} s")
        time.sleep(0.3)


def _set_node(node: str, state: str) -> None:
    run_slurm_command(["scontrol", "update", f"nodename={node}", f"state={state}", "reason=mirror-es node test"])


def _node_state(node: str) -> str:
    return run_slurm_command(["sinfo", "-h", "-n", node, "-o", "%T"]).strip()


@pytest.fixture
def node(slurm_cluster: LocalSlurm) -> Iterator[str]:
    """The cluster's node, put back in service after the test whatever happened."""
    try:
        yield slurm_cluster.node
    finally:
        if _node_state(slurm_cluster.node) not in ("idle", "mixed", "allocated"):
            _set_node(slurm_cluster.node, "resume")
        _wait(lambda: _node_state(slurm_cluster.node) in ("idle", "mixed", "allocated"), 30, "node back in service")


@pytest.mark.slow
def test_node_down_mid_job_requeues_it_and_the_member_resumes(
    slurm_cluster: LocalSlurm, node: str, tmp_path: Path
) -> None:
    background = Background(SlurmLauncher(**FAST, job_name="mirror-es-nodedown"),
                            specs(tmp_path, 1, {"steps": 10, "step_s": 1.0}), tmp_path / "launcher")
    work_dir = tmp_path / "member_000"
    _wait(lambda: _checkpoint(work_dir)["step"] >= 3, 60, "member at step 3")
    job_id = background.jobs[0]["job_id"]
    slurm_cluster.submitted.append(int(job_id.split("_")[0]))
    _set_node(node, "down")
    records, jobs = background.join(timeout=scaled(120))
    assert records[0].status == "ok", records[0].error
    assert records[0].steps_done == 10
    starts = _checkpoint(work_dir)["starts"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 3, starts  # resumed, not restarted from 0
    # SLURM requeued the same job: the launcher did not mistake the brief NODE_FAIL for a lost job
    assert jobs[0]["job_id"] == job_id and jobs[0]["submissions"] == 1, jobs
    rows = slurm_cluster.sacct([int(job_id.split("_")[0])], duplicates=True)
    assert [r.state for r in rows if r.job_id == job_id][0] == "NODE_FAIL", rows


@pytest.mark.slow
def test_node_drained_mid_job_lets_the_running_member_finish(
    slurm_cluster: LocalSlurm, node: str, tmp_path: Path
) -> None:
    background = Background(SlurmLauncher(**FAST, job_name="mirror-es-drain"),
                            specs(tmp_path, 1, {"steps": 6, "step_s": 1.0}), tmp_path / "launcher")
    work_dir = tmp_path / "member_000"
    _wait(lambda: _checkpoint(work_dir)["step"] >= 2, 60, "member at step 2")
    slurm_cluster.submitted.append(int(background.jobs[0]["job_id"].split("_")[0]))
    _set_node(node, "drain")
    records, jobs = background.join(timeout=scaled(60))
    assert records[0].status == "ok", records[0].error
    assert _checkpoint(work_dir)["starts"] == [0]  # never interrupted
    assert "drain" in _node_state(node)  # the node really was drained while the member ran


@pytest.mark.slow
def test_node_out_of_service_for_good_ends_the_member_after_max_pending_s(
    slurm_cluster: LocalSlurm, node: str, tmp_path: Path
) -> None:
    launcher = SlurmLauncher(**FAST, job_name="mirror-es-nodegone", max_pending_s=6)
    member_specs = specs(tmp_path, 1, {"steps": 600, "step_s": 0.5})
    saved: dict[int, dict] = {}
    runner = MemberArrayRunner(
        launcher, ENTRY, member_specs, {}, saved.update, tmp_path / "launcher",
        RunnerPolicy(retries=0, timeout_s=scaled(600), kill_grace_s=30, max_pending_s=launcher.config.max_pending_s),
    )
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(records=runner.run()), daemon=True)
    thread.start()
    work_dir = tmp_path / "member_000"
    _wait(lambda: _checkpoint(work_dir)["step"] >= 2, 60, "member at step 2")
    job_id = saved[0]["job_id"]
    slurm_cluster.submitted.append(int(job_id.split("_")[0]))
    began = time.monotonic()  # the job cannot be pending before the node goes down
    _set_node(node, "down")  # kills and requeues the job ...
    _set_node(node, "drain")  # ... and keeps the node from taking it back
    thread.join(timeout=scaled(240))  # a deadline, not a wait: under load slurmctld requeues late
    assert not thread.is_alive(), "the runner kept waiting for a job that can never start"
    waited = time.monotonic() - began
    record = outcome["records"][0]
    assert record.status == "timeout", (record.status, record.error)
    assert "max_pending_s=6" in record.error and job_id in record.error, record.error
    assert read_result(work_dir).status == "timeout"
    assert waited >= 6  # not before the limit
    slurm_cluster.wait_for([int(job_id.split("_")[0])], lambda rows: rows and rows[-1].state == "CANCELLED",
                           timeout=30, what="cancelled by the runner")
    assert len(_checkpoint(work_dir)["starts"]) == 1  # it never ran again


class _QueuedForever(Launcher):
    """A backend whose one job stays queued: the runner must give up after max_pending_s, not wait."""

    poll_interval_s = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[str] = []
        self.submitted = 0

    def submit(self, entrypoint, specs, folder, timeout_s):  # type: ignore[no-untyped-def]
        self.submitted += len(specs)
        return [JobRef(job_id=f"q{self.submitted}", folder=str(folder), attempt=s.attempt) for s in specs]

    def is_alive(self, ref: JobRef) -> bool:
        return ref.job_id not in self.cancelled

    def waiting(self, refs):  # type: ignore[no-untyped-def]
        return {r.job_id: "PENDING, ReqNodeNotAvail" for r in refs if r.job_id not in self.cancelled}

    def cancel(self, refs):  # type: ignore[no-untyped-def]
        self.cancelled.extend(r.job_id for r in refs)


def test_queue_limit_cancels_a_job_that_never_starts_and_retries_apply(tmp_path: Path) -> None:
    launcher = _QueuedForever()
    runner = MemberArrayRunner(
        launcher, ENTRY, specs(tmp_path, 1, {}), {}, lambda jobs: None, tmp_path / "launcher",
        RunnerPolicy(retries=1, timeout_s=60, max_pending_s=0.3, result_scan_interval_s=0.05),
    )
    records = runner.run()
    assert records[0].status == "timeout" and "ReqNodeNotAvail" in records[0].error, records[0].error
    assert launcher.cancelled == ["q1", "q2"]  # the first attempt and its retry, each cancelled
    assert (tmp_path / "member_000" / "result.attempt0.json").exists()
