"""The embedded default search (tiny model, arith, real NM-GRPO members) end to end with launcher=slurm."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from results.store.run_store import RunStore
from slurm_helpers import LocalSlurm
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_default_search_runs_its_members_as_slurm_array_tasks(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "launcher=slurm", "population=2", "generations=1",
         "train.steps=2", "train.val_size=8", "reevaluate.top_k=0", "launcher.poll_interval_s=1", "launcher.query_interval_s=5"],
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(600),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = RunStore(run_dir)
    jobs = store.read_jobs(0)
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs.values()})
    assert sorted(j["job_id"] for j in jobs.values()) == [f"{jobs[0]['job_id'].split('_')[0]}_{i}" for i in (0, 1, 2)]
    members = store.read_members()
    assert len(members) == 3 and set(members["status"]) == {"ok"}, members[["status", "error"]]
    assert members.set_index("index").loc[2, "role"] == "control"  # the centre, trained as a third array task
    assert members["val_size"].min() > 0 and members["steps_done"].min() == 2
