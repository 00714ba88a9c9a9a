"""A generation's submission, chunk by chunk, survives a failing sbatch and a killed orchestrator
(python -m meta.run launcher=slurm on the real local cluster; `sbatch` is wrapped by a script on PATH that
fails or kills its caller on a chosen call and logs every call, so duplicates are counted, not guessed).

- sbatch fails from the 2nd chunk on: the run ends with exit status 1 and a message (no traceback) saying it
  can be resumed; chunk 1's job ids are in jobs.json; the resume re-attaches to chunk 1 and submits only the
  rest (sbatch calls and sacct's arrays of this run counted).
- the orchestrator is SIGKILLed right after the 2nd chunk's sbatch (before submitit placed the pickled calls,
  and before anything was recorded): the resume finds that array by its name (squeue -n), cancels its tasks
  (they could only fail without their call), and every member still runs exactly once.
"""
from __future__ import annotations

import os
import shutil
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

# (Its variables are not named SBATCH_*: the launcher strips those before sbatch.)
# Calls the real sbatch, except: from call number $FAIL_FROM on it fails like an overloaded controller; on
# call number $KILL_AT it submits the array held (so it stays queued) and then SIGKILLs its caller.
WRAPPER = """#!/bin/bash
echo "$*" >> "$FAKE_SBATCH_LOG"
n=$(wc -l < "$FAKE_SBATCH_LOG")
if [ "${FAIL_FROM:-0}" -gt 0 ] && [ "$n" -ge "$FAIL_FROM" ]; then
    echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
    exit 1
fi
if [ "${KILL_AT:-0}" = "$n" ]; then
    "$REAL_SBATCH" --hold "$@"
    kill -9 $PPID
    exit 0
fi
exec "$REAL_SBATCH" "$@"
"""


def _wrapped_env(tmp_path: Path, log: Path, **settings: int) -> dict[str, str]:
    real = shutil.which("sbatch")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(WRAPPER)
    (bin_dir / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SBATCH_LOG=str(log), REAL_SBATCH=real)
    env.update({k: str(v) for k, v in settings.items()})
    return env


def _meta_run(run_dir: Path, job_name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    args = [
        f"run_dir={run_dir}", "new=true", "launcher=slurm", "inner.entrypoint=meta.synthetic:member",
        f"population={POPULATION}", "generations=1", "es=cmaes", "+inner.options={count_calls:true,sleep_s:15}",
        "launcher.max_array_size=2", "launcher.poll_interval_s=0.5", "launcher.query_interval_s=2",
        "launcher.submit_attempts=2", "launcher.submit_backoff_s=0.5", f"launcher.job_name={job_name}",
        "control_member=false", "reevaluate.top_k=0",  # the chunk and sbatch counts below are the population's
    ]
    return subprocess.run([sys.executable, "-m", "meta.run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=scaled(240))


def _arrays_named(prefix: str) -> dict[str, list[tuple[str, str]]]:
    """sacct: this test's arrays by job name -> [(task id, state)]."""
    out = run_slurm_command(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State", "-S", "now-1hour"])
    arrays: dict[str, list[tuple[str, str]]] = {}
    for line in out.splitlines():
        job_id, name, state = line.split("|")
        if name.startswith(prefix + "."):
            arrays.setdefault(name, []).append((job_id, state.split()[0]))
    return arrays


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _assert_each_member_ran_once(store: RunStore, log: str) -> None:
    for i in range(POPULATION):
        calls = (store.member_dir(0, i) / "calls.log").read_text().splitlines()
        assert calls == ["attempt 0"], f"member {i} ran {len(calls)} times; orchestrator log:\n{log[-3000:]}"


def _chunk_one_reattached_or_read_back(stderr: str) -> bool:
    """Members 0 and 1 (chunk 1, recorded before the interruption) were taken up again, not resubmitted: re-attached
    to their jobs when still running at the resume, or, when they finished first (a slow machine, a busy cluster),
    their results read back before anything was submitted. Which of the two happens is the machine's timing."""
    before_submitting = stderr.split("submitted 2 member(s) as SLURM array", 1)[0]
    return all(f"gen 0 member {i:03d}: re-attached" in stderr or f"gen 0 member {i:03d} ok" in before_submitting
               for i in (0, 1))


def test_sbatch_failing_on_the_second_chunk_ends_cleanly_and_the_resume_submits_only_the_rest(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    run_dir, store = tmp_path / "run", RunStore(tmp_path / "run")
    job_name = f"mirror-es-subfail-{os.getpid()}"
    first_log = tmp_path / "sbatch_first.log"
    first = _meta_run(run_dir, job_name, _wrapped_env(tmp_path, first_log, FAIL_FROM=2))
    arrays = _arrays_named(job_name)
    slurm_cluster.submitted.extend(int(t.split("_")[0]) for tasks in arrays.values() for t, _ in tasks)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "Traceback" not in first.stderr, first.stderr[-3000:]
    assert "launcher.submit_attempts=2" in first.stderr and "resume the run" in first.stderr, first.stderr[-3000:]
    assert _calls(first_log) == 3  # chunk 1, then chunk 2 tried twice
    recorded = store.read_jobs(0)
    assert sorted(recorded) == [0, 1], recorded  # chunk 1's ids were saved before chunk 2 was tried

    second_log = tmp_path / "sbatch_second.log"
    resumed = _meta_run(run_dir, job_name, _wrapped_env(tmp_path, second_log))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _calls(second_log) == 2  # members 2-3 and 4-5: chunk 1 was not submitted again
    assert _chunk_one_reattached_or_read_back(resumed.stderr), resumed.stderr[-3000:]
    jobs = store.read_jobs(0)
    assert {i: jobs[i]["job_id"] for i in (0, 1)} == {i: recorded[i]["job_id"] for i in (0, 1)}
    _assert_each_member_ran_once(store, resumed.stderr)
    arrays = _arrays_named(job_name)
    slurm_cluster.submitted.extend(int(t.split("_")[0]) for tasks in arrays.values() for t, _ in tasks)
    assert sum(len(tasks) for tasks in arrays.values()) == POPULATION, arrays  # 3 arrays, no duplicate task
    assert len(arrays) == 3 and all(name.startswith(f"{job_name}.") and ".g0000.c" in name for name in arrays)


def test_orchestrator_killed_right_after_an_sbatch_is_resumed_without_running_a_member_twice(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    run_dir, store = tmp_path / "run", RunStore(tmp_path / "run")
    job_name = f"mirror-es-subkill-{os.getpid()}"
    first = _meta_run(run_dir, job_name, _wrapped_env(tmp_path, tmp_path / "sbatch_first.log", KILL_AT=2))
    assert first.returncode == -9, first.stderr[-3000:]
    orphan = f"{job_name}.{store.read_manifest()['run_id']}.g0000.c001"
    queued = run_slurm_command(["squeue", "-h", "-r", "-n", orphan, "-o", "%i"]).split()
    slurm_cluster.submitted.extend(int(t.split("_")[0]) for t in queued)
    assert len(queued) == 2, queued  # the 2nd array is queued (held) ...
    assert sorted(store.read_jobs(0)) == [0, 1]  # ... but recorded nowhere

    second_log = tmp_path / "sbatch_second.log"
    resumed = _meta_run(run_dir, job_name, _wrapped_env(tmp_path, second_log))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _calls(second_log) == 2  # the orphan's members again, and chunk 3: chunk 1 not resubmitted
    _assert_each_member_ran_once(store, resumed.stderr)
    assert _chunk_one_reattached_or_read_back(resumed.stderr), resumed.stderr[-3000:]
    assert "submitted without their call" in resumed.stderr, resumed.stderr[-3000:]
    # The orphan was found by name and cancelled. A held array cancelled before it was ever eligible may
    # never reach accounting, so the controller's record is asked (MinJobAge keeps it a day).
    states = run_slurm_command(["squeue", "-h", "-t", "all", "-r", "-n", orphan, "-o", "%T"]).split()
    assert states and set(states) == {"CANCELLED"}, states  # a pending array cancelled whole is one record
    deadline = time.monotonic() + scaled(30)  # accounting may lag a few seconds behind the last task's end
    while True:
        arrays = _arrays_named(job_name)
        if sum(len(tasks) for tasks in arrays.values()) >= POPULATION or time.monotonic() > deadline:
            break
        time.sleep(1)
    slurm_cluster.submitted.extend(int(t.split("_")[0]) for tasks in arrays.values() for t, _ in tasks)
    run_id = store.read_manifest()["run_id"]
    assert sorted(arrays) == [f"{job_name}.{run_id}.g0000.c{c:03d}" for c in (0, 2, 3)], arrays
    assert sorted(state for tasks in arrays.values() for _, state in tasks) == ["COMPLETED"] * POPULATION, arrays
