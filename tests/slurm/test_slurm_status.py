"""On the real local cluster: the re-evaluation runs as array tasks, and meta.status shows a queued member with
SLURM's pending reason."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meta.status.view import render
from results.store.layout import JOBS_FILE
from results.store.run_store import RunStore, read_jobs_file
from slurm_helpers import LocalSlurm, run_slurm_command
from time_limits import scaled

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_queued_member_shows_the_schedulers_pending_reason(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "launcher=slurm", "population=2", "generations=1",
         "inner.entrypoint=meta.synthetic:member", "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=2",
         "reevaluate.baselines=[kl]", "control_member=false",
         "launcher.poll_interval_s=1", "launcher.query_interval_s=5"],
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(600),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = RunStore(run_dir)
    slurm_cluster.submitted.extend(int(j["job_id"].split("_")[0]) for j in store.read_jobs(0).values())
    # both re-evaluation stages ran as SLURM array tasks too: selection 2 inits x 2 seeds, reporting the exported
    # init and KL x 2 other seeds
    summary = store.read_reevaluation()
    assert [c["n"] for c in summary["candidates"]] == [2, 2]
    assert [row["metrics"]["validation"]["n"] for row in store.read_result_table()["rows"]] == [2, 2]
    for folder in (store.reevaluate_dir(), store.reevaluate_dir(reporting=True)):
        jobs = read_jobs_file(folder / JOBS_FILE)
        slurm_cluster.submitted.extend(int(j["job_id"].split("_")[0]) for j in jobs.values())
        assert len(jobs) == 4 and all("_" in j["job_id"] for j in jobs.values())
    # Generation 1 as a live search leaves it: member 0's job is queued and held (the reason SLURM gives is what
    # the status must show), member 1 not submitted yet.
    held = slurm_cluster.sbatch("--hold", wrap="sleep 1", workdir=tmp_path)
    store.write_population(1, store.read_population(0))
    store.write_jobs(1, {0: {"job_id": str(held), "folder": str(tmp_path), "attempt": 0, "submissions": 1}})
    store.member_dir(1, 0).mkdir(parents=True)
    try:
        text = render(run_dir)
    finally:  # a held job never ends on its own
        run_slurm_command(["scancel", str(held)])
    row = next(line for line in text.splitlines() if line.startswith("  member 000"))
    assert "queued" in row and f"job {held}, JobHeldUser" in row, text
    assert "not submitted" in next(line for line in text.splitlines() if line.startswith("  member 001"))
