"""es=nres on the local SLURM cluster: a particle requeued by SLURM in mid-truncation resumes from its own checkpoint,
and the orchestrator killed (SIGKILL) in the same generation resumes to the centre and particle states of an
uninterrupted run (launcher=debug), with no truncation run again except the requeued one's own second start."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from meta.search.run import main
from meta.synthetic import CHECKPOINT_FILE
from core.records import MemberSpec
from results.store.layout import SPEC_FILE
from results.store.run_store import RunStore
from slurm_helpers import LocalSlurm, run_slurm_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
K = 8
SEARCH = ["inner.entrypoint=meta.synthetic:member", "es=nres", "train.steps=24", f"es.truncation_steps={K}",
          "es.radius=0.01", "population=4", "generations=2", "reevaluate.top_k=0",
          "+inner.options={unrolled:{floor:0.5},count_calls:true,step_s:1.0}"]


def _meta_run(run_dir: Path, job_name: str, stderr: Path) -> subprocess.Popen:
    args = [f"run_dir={run_dir}", "new=true", "launcher=slurm", "launcher.poll_interval_s=0.5",
            "launcher.query_interval_s=2", f"launcher.job_name={job_name}", *SEARCH]
    with stderr.open("wb") as handle:
        return subprocess.Popen([sys.executable, "-m", "meta.run", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=handle)


def _step(work_dir: Path) -> int:
    try:
        return int(json.loads((work_dir / CHECKPOINT_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _truncation(work_dir: Path) -> tuple[int, int]:
    """The member's own truncation [start, stop) from its spec's segment (stagger spreads pairs' phases over the run)."""
    try:
        segment = MemberSpec.from_dict(json.loads((work_dir / SPEC_FILE).read_text())).work
        return segment.start, segment.stop
    except (OSError, ValueError, KeyError, TypeError):
        return -1, -1


def test_a_particle_requeued_mid_truncation_resumes_and_a_killed_orchestrator_resumes_exactly(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    assert main([f"run_dir={reference}", "new=true", "launcher=debug", *SEARCH]) == 0
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    job_name = f"mirror-es-nres-{os.getpid()}"
    first = _meta_run(run_dir, job_name, tmp_path / "first.err")
    # Generation 1: wait until member 2 is two steps into its truncation [start, start + K) (where it starts depends
    # on its pair's phase), then requeue its job (6 s of its truncation left: SLURM's KillWait here is 2 s).
    deadline = time.monotonic() + 300
    start = -1
    while start < 0 or _step(store.member_dir(1, 2)) < start + 2:
        start = _truncation(store.member_dir(1, 2))[0]
        assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
        assert time.monotonic() < deadline, "generation 1's member 2 did not start within 300 s"
        time.sleep(0.1)
    job = store.read_jobs(1)[2]["job_id"]
    slurm_cluster.submitted.append(int(job.split("_")[0]))
    run_slurm_command(["scontrol", "requeue", job])
    os.kill(first.pid, signal.SIGKILL)  # the orchestrator dies in the same generation
    first.wait()
    resumed = _meta_run(run_dir, job_name, tmp_path / "resumed.err")
    resumed.wait(timeout=600)
    assert resumed.returncode == 0, (tmp_path / "resumed.err").read_text()[-3000:]

    want = RunStore(reference)
    for generation in (0, 1):
        got, expected = store.read_state(generation), want.read_state(generation)
        assert torch.equal(got["center"], expected["center"])
        assert {k: got["searcher"][k] for k in ("step", "stop", "episode")} == {
            k: expected["searcher"][k] for k in ("step", "stop", "episode")}
    calls = (store.member_dir(1, 2) / "calls.log").read_text().splitlines()
    assert len(calls) == 2, f"the requeued particle ran {len(calls)} time(s)"
    members = store.read_members().set_index(["generation", "index"]).sort_index()
    stop = _truncation(store.member_dir(1, 2))[1]
    assert start < members.loc[(1, 2), "diag_resumed_at"] < stop  # its second start continued mid-truncation
    for generation in (0, 1):
        for index in range(4):
            if (generation, index) != (1, 2):
                lines = (store.member_dir(generation, index) / "calls.log").read_text().splitlines()
                assert lines == ["attempt 0"], f"truncation {generation}:{index} ran {len(lines)} times"
    expected_members = want.read_members().set_index(["generation", "index"]).sort_index()
    assert members["fitness"].tolist() == expected_members["fitness"].tolist()
