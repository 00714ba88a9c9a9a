"""The pilot on the rehearsal preset (mbpp_qwen3 with SmolLM2-135M, LoRA, the MBPP fixture, the sandbox) as SLURM
array tasks on the local cluster: a test of the plumbing. Two training steps measure no signal, so nothing here
asserts one; it asserts that every run was a real member, that the findings were computed from their records,
and that the report shows them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from results.store.layout import JOBS_FILE
from results.store.run_store import RunStore, read_jobs_file
from slurm_helpers import LocalSlurm
from test_slurm_rehearsal import ROOT, rehearsal_overrides

pytestmark = pytest.mark.slow


def test_the_pilot_runs_the_rehearsal_preset_as_slurm_array_tasks(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "pilot"
    # the pilot's smallest design (2 seeds x (centre + 1 pair) = 6 SmolLM2 runs), each run one step, generating
    # with HF generate: vLLM's engines (test_slurm_rehearsal.py runs them) bind their threads to every allowed core,
    # and 6 of them on this machine's 2 cores took 4-5 min a run instead of ~1.5
    overrides = [o for o in rehearsal_overrides(run_dir) if not o.startswith(("generations=", "population=",
                                                                               "train.steps=", "++train.trl="))]
    done = subprocess.run([sys.executable, "-m", "meta.pilot", *overrides, "train.steps=1", "population=4",
                           "pilot.seeds=2", "pilot.pairs=1"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    store = RunStore(run_dir)
    jobs = read_jobs_file(store.pilot_runs_dir / JOBS_FILE) if run_dir.exists() else {}
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs.values()})
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(jobs) == 6 and all("_" in j["job_id"] for j in jobs.values())  # centre x 2 + 1 pair x 2, 2 seeds
    records = [json.loads(p.read_text()) for p in sorted(store.pilot_runs_dir.glob("member_*/result.json"))]
    assert len(records) == 6 and {r["status"] for r in records} == {"ok"}
    assert {r["steps_done"] for r in records} == {1} and {r["val_size"] for r in records} == {6}
    summary = store.read_pilot()
    combination = summary["combinations"][0]
    centre = [r["fitness"] for r in records[:2]]
    assert combination["centre"]["mean"] == pytest.approx(sum(centre) / 2)
    report = subprocess.run([sys.executable, "-m", "results.report", str(run_dir)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0 and "seed noise of one init" in report.stdout, report.stderr[-2000:]
