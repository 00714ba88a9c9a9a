"""SIGKILL the orchestrator (a real subprocess, local launcher) at random points; the resumed run must end
in exactly the state of an uninterrupted run, and no member may run twice."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from meta.search.run import main
from helpers import wait_for_file
from results.store.run_store import RunStore
from time_limits import scaled

ROOT = Path(__file__).resolve().parents[3]
ARGS = ["inner.entrypoint=meta.synthetic:member", "population=4", "generations=3", "es=cmaes",
        "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=2", "reevaluate.baselines=[center,kl]",
        "+inner.options={count_calls:true,sleep_s:0.3,noise:0.05,baseline_fitness:{kl:0.4}}"]


def _start(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "launcher=local", *ARGS],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=False,
    )


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    assert main([f"run_dir={reference}", "new=true", "launcher=debug", *ARGS]) == 0

    run_dir = tmp_path / "killed"
    store = RunStore(run_dir)
    rng = random.Random(20261122)
    # Kill while members of gen 0 are in flight, right after a generation's tell, around the last ask, and while
    # the re-evaluation's two stages run.
    triggers = [(store.jobs_path(0), 1.0), (store.state_path(0), 0.3), (store.population_path(2), 0.5),
                (store.candidates_path, 0.8), (store.report_rows_path, 0.8)]
    kills = 0
    for trigger, spread in triggers:
        proc = _start(run_dir)
        wait_for_file(trigger, proc)
        time.sleep(rng.uniform(0.0, spread))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 4, "the orchestrator finished before it could be killed; the test did not test anything"

    final = _start(run_dir)
    _, err = final.communicate(timeout=scaled(300))
    assert final.returncode == 0, err.decode()[-3000:]

    ref_store = RunStore(reference)
    assert store.state_generations() == ref_store.state_generations() == [0, 1, 2]
    for generation in range(3):
        got, want = store.read_state(generation), ref_store.read_state(generation)
        assert torch.equal(got["center"], want["center"])
        for key in ("fitness_history", "population_digests"):
            assert got["searcher"][key].__len__() == want["searcher"][key].__len__()
        assert got["searcher"]["population_digests"] == want["searcher"]["population_digests"]
        assert got["mean_fitness"] == want["mean_fitness"]
        assert {k: v for k, v in got["best"].items() if k != "run_id"} == {
            k: v for k, v in want["best"].items() if k != "run_id"
        }
        for index in range(5):  # the population and the control member
            calls = (store.member_dir(generation, index) / "calls.log").read_text().splitlines()
            assert calls == ["attempt 0"], f"member {generation}:{index} ran {len(calls)} times"
    for folder, count in ((store.reevaluate_dir(), 4), (store.reevaluate_dir(reporting=True), 6)):
        runs = sorted(folder.glob("member_*"))
        assert len(runs) == count  # selection: (top 1 + centre) x 2 seeds; reporting: 3 rows x 2 seeds
        for run in runs:
            assert (run / "calls.log").read_text().splitlines() == ["attempt 0"], f"{run} ran more than once"
    assert store.read_reevaluation() == ref_store.read_reevaluation()
    assert store.read_result_table() == ref_store.read_result_table() is not None
    got_members = store.read_members().sort_values(["generation", "index"])
    want_members = ref_store.read_members().sort_values(["generation", "index"])
    assert got_members["fitness"].tolist() == want_members["fitness"].tolist()
