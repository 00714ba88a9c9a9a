"""Save on notice (inner_loop/process/notice.py) without a cluster: a member's job process told that its job ends (SIGTERM,
as SLURM sends on a requeue or a preemption) has its pinned training process save a checkpoint at the end of the
step under way and stop without a record; run again, it resumes from that step and ends with the uninterrupted
run's record. tests/slurm/test_slurm_save_on_notice.py does the same through `scontrol requeue` on the cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import inner_loop.process.pinned as numerics
from inner_loop.training.checkpoints import checkpoint_folders
from results.store.member_files import read_progress, read_result
from helpers import NOTICE_STEPS as STEPS, notice_spec, same_outcome
from time_limits import scaled, wait_until

pytestmark = pytest.mark.skipif(not numerics.can_pin(), reason="the tiny preset's pinned numerics need AVX2 and FMA")

ROOT = Path(__file__).resolve().parents[3]
#: the job process of a SLURM array task runs the member (submitit sets SUBMITIT_EXECUTOR there)
JOB_PROCESS = "import json, sys\nfrom inner_loop.member.entry import train_member\ntrain_member(json.loads(sys.argv[1]))"


def _job(spec: dict) -> subprocess.Popen:
    env = {**os.environ, "SUBMITIT_EXECUTOR": "slurm", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", JOB_PROCESS, json.dumps(spec)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)




def test_a_notice_saves_the_step_under_way_and_the_rerun_ends_as_the_uninterrupted_run(tmp_path):
    reference_job = _job(notice_spec(tmp_path / "straight"))
    spec = notice_spec(tmp_path / "noticed")
    work = Path(spec["work_dir"])
    job = _job(spec)
    wait_until(lambda: (progress := read_progress(work)) is not None and progress.step >= 3, 300, "the member at step 3")
    seen = read_progress(work).step
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=scaled(120))
    assert job.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert read_result(work) is None  # stopped for a requeue: no record, nothing charged
    saved = [int(p.name.rpartition("-")[2]) for p in checkpoint_folders(work)]
    assert len(saved) == 1 and seen <= saved[0] < STEPS, (seen, saved)  # the step under way, at most one later
    assert "on notice" in stderr

    rerun = _job(spec)
    _, rerun_err = rerun.communicate(timeout=scaled(300))
    assert rerun.returncode == 0, rerun_err[-3000:]
    assert f"checkpoint-{saved[0]}" in rerun_err  # resumed from the notice's checkpoint
    reference_job.communicate(timeout=scaled(300))
    record, reference = read_result(work), read_result(tmp_path / "straight")
    assert record.status == reference.status == "ok" and record.steps_done == STEPS, record.error
    mine, theirs = same_outcome(record, reference)
    assert mine == theirs
