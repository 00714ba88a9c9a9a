"""Save on notice on the local cluster: `scontrol requeue` of a running member (SLURM's SIGTERM, then SIGKILL
after KillWait, then the same job id queued again) costs it at most the step under way. The member (the tiny
preset, trained in its pinned process) saves a checkpoint at the end of that step, the requeued run resumes from
there, and the final record equals that of the same member run without interruption."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from inner_loop.member.entry import train_member
from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from results.store.member_files import read_progress
from core.records import MemberSpec
from helpers import NOTICE_STEPS as STEPS, notice_spec, same_outcome
from slurm_helpers import LocalSlurm, run_slurm_command
from slurm_launch_helpers import FAST
from time_limits import scaled

pytestmark = pytest.mark.slow

ENTRY = "inner_loop.member.entry:train_member"


def test_scontrol_requeue_costs_at_most_the_step_under_way(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    spec = MemberSpec(**notice_spec(tmp_path / "member_000"))
    saved_jobs: dict[int, dict] = {}
    runner = MemberArrayRunner(SlurmLauncher(**FAST, time_min=15, job_name="mirror-es-notice-requeue"), ENTRY,
                               [spec], {}, saved_jobs.update, tmp_path / "launcher",
                               RunnerPolicy(retries=0, timeout_s=scaled(900), kill_grace_s=30))
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(records=runner.run()), daemon=True)
    thread.start()
    work = Path(spec.work_dir)
    deadline = time.monotonic() + scaled(300)
    while (progress := read_progress(work)) is None or progress.step < 3:
        assert time.monotonic() < deadline and thread.is_alive(), "the member never reached step 3"
        time.sleep(0.05)
    job_id = saved_jobs[0]["job_id"]
    slurm_cluster.submitted.append(int(job_id.split("_")[0]))
    run_slurm_command(["scontrol", "requeue", job_id])
    reference = train_member(notice_spec(tmp_path / "straight"))  # meanwhile, the same member uninterrupted
    thread.join(timeout=scaled(600))
    assert not thread.is_alive(), "the requeued member did not finish"
    record = outcome["records"][0]
    assert record.status == "ok" and record.steps_done == STEPS, record.error
    assert saved_jobs[0]["job_id"] == job_id  # requeued under its id, never resubmitted
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "launcher").rglob("*.err"))
    noticed = [int(step) for step in re.findall(r"saved checkpoint-(\d+) on notice", logs)]
    resumed = [int(step) for step in re.findall(r"resuming from \S*checkpoint-(\d+)", logs)]
    assert len(noticed) == 1 and progress.step <= noticed[0] < STEPS, (progress.step, noticed)
    assert resumed == noticed, (resumed, noticed)
    mine, theirs = same_outcome(record, reference)
    assert mine == theirs
