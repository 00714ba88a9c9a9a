"""SIGKILL the orchestrator (python -m meta.run launcher=slurm) mid-generation, resume with run_dir=: it
re-attaches to the queued/running array tasks by job id, reads finished results, and submits nothing again
(checked in sacct: the generation's tasks are exactly the first array's)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from results.store.run_store import RunStore
from slurm_helpers import LocalSlurm, run_slurm_command
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
POPULATION = 6


def _meta_run(run_dir: Path, job_name: str, gate: Path, stderr: Path) -> subprocess.Popen:
    # Member 0 finishes at once; the others run until the test creates `gate`, so some jobs are live when the
    # resumed orchestrator looks, however slow the machine.
    options = f"{{count_calls:true,wait_for_file:'{gate}',wait_skip:[0]}}"
    args = [
        f"run_dir={run_dir}", "new=true", "launcher=slurm", "inner.entrypoint=meta.synthetic:member",
        f"population={POPULATION}", "generations=1", "es=cmaes", f"+inner.options={options}",
        "launcher.array_parallelism=3", "launcher.poll_interval_s=0.5", "launcher.query_interval_s=2",
        f"launcher.job_name={job_name}", "control_member=false", "reevaluate.top_k=0",  # the population's jobs only
    ]
    with stderr.open("wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "meta.run", *args], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=handle)


def test_sigkill_mid_generation_then_resume_reattaches_and_resubmits_nothing(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    job_name = f"mirror-es-resume-{os.getpid()}"
    gate, first_log, resumed_log = tmp_path / "release", tmp_path / "first.err", tmp_path / "resumed.err"
    first = _meta_run(run_dir, job_name, gate, first_log)
    # Kill once member 0 finished while the others are still queued or running (array_parallelism=3).
    deadline = time.monotonic() + scaled(120)
    while sum((store.member_dir(0, i) / "result.json").exists() for i in range(POPULATION)) < 1:
        assert first.poll() is None, first_log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no member finished within 120 s"
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    jobs_before = store.read_jobs(0)
    assert len(jobs_before) == POPULATION
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs_before.values()})
    unfinished = [i for i in range(POPULATION) if not (store.member_dir(0, i) / "result.json").exists()]
    assert unfinished, "every member finished before the kill; the test did not test re-attaching"

    resumed = _meta_run(run_dir, job_name, gate, resumed_log)
    deadline = time.monotonic() + scaled(120)
    while "re-attached" not in resumed_log.read_text():  # the live jobs are found, not resubmitted
        assert resumed.poll() is None, resumed_log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the resumed orchestrator re-attached to no job within 120 s"
        time.sleep(0.2)
    gate.touch()
    resumed.wait(timeout=scaled(180))
    err = resumed_log.read_text()
    assert resumed.returncode == 0, err[-3000:]

    assert store.state_generations() == [0]
    assert {i: j["job_id"] for i, j in store.read_jobs(0).items()} == {
        i: j["job_id"] for i, j in jobs_before.items()
    }
    for i in range(POPULATION):
        calls = (store.member_dir(0, i) / "calls.log").read_text().splitlines()
        assert calls == ["attempt 0"], f"member {i} ran {len(calls)} times"
    array_name = f"{job_name}.{store.read_manifest()['run_id']}.g0000.c000"  # <job_name>.<run>.g<gen>.c<chunk>
    expected = sorted(j["job_id"] for j in jobs_before.values())
    deadline = time.monotonic() + scaled(60)
    while True:  # the accounting database lists a task that just ended only after slurmctld has sent it over
        rows = run_slurm_command(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "--name", array_name,
                                  "-S", "now-1hour"])
        tasks = [line.split("|") for line in rows.split()]
        if set(expected) <= {t[0] for t in tasks} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(t[0] for t in tasks) == expected, tasks  # the first array's tasks, and no other
    assert "re-attached" in err
