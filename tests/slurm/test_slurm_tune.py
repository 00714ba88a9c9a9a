"""meta.tune with launcher=slurm on the local cluster: trials' runs as array tasks, pruning by scancel, a SIGKILL of
the tuner mid-study and a resume that re-attaches to the queued and running tasks; then a real coef x lr tuning
of the embedded default (tiny model) as SLURM jobs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from meta.tune.trials import trial_dir
from results.store.layout import JOBS_FILE, TRIAL_FILE, TRIALS_DIR
from results.store.member_files import read_result
from results.store.run_store import read_jobs_file
from results.store.study_store import LOST_ATTR, load_study
from slurm_helpers import LocalSlurm
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SLURM = ["launcher=slurm", "launcher.poll_interval_s=0.5", "launcher.query_interval_s=2"]


def _tune(run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meta.tune", f"run_dir={run_dir}", "new=true", *SLURM, *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _jobs(run_dir: Path) -> dict[int, dict]:
    return read_jobs_file(run_dir / TRIALS_DIR / JOBS_FILE)


def _job_ids(run_dir: Path) -> set[int]:
    return {int(str(entry["job_id"]).split("_")[0]) for entry in _jobs(run_dir).values()}


def test_a_pruned_tuning_survives_a_sigkill_and_resumes_on_slurm(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "tune"
    args = ["inner.entrypoint=meta.tune.synthetic:run", "tune.sampler=random", "tune.trials=6", "tune.parallel=2",
            "tune.pruner=median", "tune.pruner_options={n_startup_trials: 1}", "train.steps=30", "train.eval_every=3",
            "+inner.options={step_s: 0.5, count_calls: true}", f"launcher.job_name=mirror-es-tune-{os.getpid()}"]
    first = _tune(run_dir, *args)
    deadline = time.monotonic() + scaled(180)
    while not (trial_dir(run_dir, 2) / TRIAL_FILE).exists():  # two trials asked, a third on its way
        assert first.poll() is None, first.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the tuner asked no third trial within 180 s"
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    slurm_cluster.submitted.extend(_job_ids(run_dir))

    resumed = _tune(run_dir, *args)
    _, err = resumed.communicate(timeout=scaled(420))
    assert resumed.returncode == 0, err.decode()[-3000:]
    slurm_cluster.submitted.extend(_job_ids(run_dir))

    study = load_study(run_dir)
    counted = [t for t in study.trials if not t.user_attrs.get(LOST_ATTR)]
    assert len(counted) == 6 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    states = {t.state for t in counted}
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states, [(t.number, t.state) for t in counted]
    for t in counted:
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        (member,) = plan["members"]
        record = read_result(member["work_dir"])
        assert record.status == ("pruned" if t.state == TrialState.PRUNED else "ok"), record.error
        calls = (Path(member["work_dir"]) / "calls.log").read_text().splitlines()
        assert calls == ["attempt 0"], f"trial {t.number}'s run trained {len(calls)} times"
    # the pruned runs were stopped by scancel: SLURM says so
    pruned_ids = [_jobs(run_dir)[t.number]["job_id"] for t in counted if t.state == TrialState.PRUNED]
    slurm_cluster.wait_for(  # accounting may lag the scancel
        _job_ids(run_dir), lambda rows: all({r.job_id: r.state for r in rows}.get(job_id, "").startswith("CANCELLED")
                                            for job_id in pruned_ids), timeout=60, what=f"{pruned_ids} CANCELLED")


def test_the_embedded_default_tuning_runs_its_trials_as_slurm_jobs(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "tune"
    done = subprocess.run(
        [sys.executable, "-m", "meta.tune", f"run_dir={run_dir}", "new=true", *SLURM, "tune.trials=2", "tune.parallel=2",
         "train.steps=4", "train.eval_every=2", "train.eval_subset=8", "train.val_size=16"],
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(600))
    slurm_cluster.submitted.extend(_job_ids(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    study = load_study(run_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert all(0.0 <= t.value <= 1.0 and sorted(t.intermediate_values) == [2] for t in study.trials)
