"""The pilot as SLURM array tasks on the local cluster, on the embedded default (tiny model, arith, real NM-GRPO
runs): a test of the plumbing. The preset's own training path on SLURM (SmolLM2, LoRA, MBPP, the sandbox, vLLM)
is test_slurm_rehearsal.py's; a pilot run is a member like any other. One training step measures no signal, so
nothing here asserts one: it asserts that every run was a real member, that the findings were computed from their
records, and that the report shows them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from results.store.layout import JOBS_FILE
from results.store.run_store import RunStore, read_jobs_file
from slurm_helpers import LocalSlurm
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VALIDATION_PROBLEMS = 8


def test_the_pilot_runs_its_design_as_slurm_array_tasks(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "pilot"
    # the pilot's smallest design: 2 seeds x (centre + 1 antithetic pair) = 6 runs, one step each
    done = subprocess.run([sys.executable, "-m", "meta.pilot", f"run_dir={run_dir}", "new=true", "launcher=slurm",
                           "launcher.poll_interval_s=1", "launcher.query_interval_s=5", "train.steps=1",
                           f"train.val_size={VALIDATION_PROBLEMS}", "population=4", "pilot.seeds=2", "pilot.pairs=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=scaled(900))
    store = RunStore(run_dir)
    jobs = read_jobs_file(store.pilot_runs_dir / JOBS_FILE) if run_dir.exists() else {}
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs.values()})
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(jobs) == 6 and all("_" in j["job_id"] for j in jobs.values())  # array tasks
    records = [json.loads(p.read_text()) for p in sorted(store.pilot_runs_dir.glob("member_*/result.json"))]
    assert len(records) == 6 and {r["status"] for r in records} == {"ok"}
    assert {r["steps_done"] for r in records} == {1} and {r["val_size"] for r in records} == {VALIDATION_PROBLEMS}
    summary = store.read_pilot()
    combination = summary["combinations"][0]
    centre = [r["fitness"] for r in records[:2]]
    assert combination["centre"]["mean"] == pytest.approx(sum(centre) / 2)
    report = subprocess.run([sys.executable, "-m", "results.report", str(run_dir)], cwd=ROOT, capture_output=True,
                            text=True, timeout=scaled(300))
    assert report.returncode == 0 and "seed noise of one init" in report.stdout, report.stderr[-2000:]
