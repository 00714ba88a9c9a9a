"""Running time over a real SLURM requeue (issue 13, item 2): a member that gets the preemption notice
(USR2 to the batch shell) requeues itself under the same job id; its first run's time is recorded on the way
out, the requeued run starts from it, and the time the job spent queued in between is not counted.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from launch.member import read_ledger
from launch.slurm.launcher import SlurmLauncher
from slurm_helpers import LocalSlurm, run_slurm_command
from slurm_launch_helpers import FAST, Background, specs
from time_limits import scaled

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)


def _step(work_dir: Path) -> int:
    try:
        return json.loads((work_dir / "synthetic_ckpt.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def test_a_requeued_member_adds_up_its_running_time_and_not_its_queue_time(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    member_specs = specs(tmp_path, 1, {"steps": 10, "step_s": 1.0})
    work_dir = Path(member_specs[0].work_dir)
    background = Background(SlurmLauncher(**FAST, time_min=15, job_name="mirror-es-ledger"), member_specs,
                            tmp_path / "launcher", timeout_s=scaled(600))
    deadline = time.monotonic() + scaled(60)
    while _step(work_dir) < 3:
        assert time.monotonic() < deadline, "member not at step 3 within 60 s"
        time.sleep(0.3)
    first_start = read_ledger(work_dir).started_at
    job_id = background.jobs[0]["job_id"]
    slurm_cluster.submitted.append(int(job_id.split("_")[0]))
    run_slurm_command(["scancel", "--signal=USR2", "--batch", job_id])
    records, jobs = background.join(timeout=scaled(180))
    ended = time.time()
    assert records[0].status == "ok", records[0].error
    assert jobs[0]["job_id"] == job_id and jobs[0]["submissions"] == 1  # requeued, not resubmitted
    ledger = read_ledger(work_dir)
    assert ledger.attempt == 0 and ledger.running is False
    # the first run ran >= 3 steps before its notice; its exit wrote its time, which the second run started from
    assert ledger.used_before_s >= 3.0 and ledger.started_at > first_start + ledger.used_before_s
    # ten 1-s steps plus start-up, summed over both runs; the wait between the runs (SLURM's requeue delay and
    # the queue) is not in it
    gap = ledger.started_at - (first_start + ledger.used_before_s)
    logger.info("running time %.1f s (first run %.1f s), wait between runs %.1f s, wall %.1f s",
                ledger.used_s, ledger.used_before_s, gap, ended - first_start)
    assert gap > 5.0, (ledger, gap)
    assert 10.0 <= ledger.used_s <= ended - first_start - gap + 1.0, (ledger, gap, ended - first_start)
