"""Packed array tasks on the real cluster (resources.members_per_gpu=2, issue 38), with CPU members (the synthetic
objective): six members run as three array tasks; an orchestrator restarted after the submission re-attaches to
them; then, each in its own task, a member SIGKILLed (its partner's result stands), a task requeued by
`scontrol requeue` after one of its members finished (only the other runs again, from its checkpoint), and a member
stopped alone at a quorum close (its partner goes on and its task ends after it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launch.base import JobRef
from launch.member import read_ledger
from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from meta.search.run import main
from results.store.gpu_share import read_gpu_share
from results.store.member_files import read_result
from results.store.run_store import RunStore
from slurm_helpers import LocalSlurm, run_slurm_command
from slurm_launch_helpers import ENTRY, FAST, specs
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKED = {**FAST, "members_per_gpu": 2, "job_name": "mirror-es-packed"}
ENDLESS = {"steps": 100_000, "step_s": 0.2}


def _step(work_dir: str) -> int:
    try:
        return json.loads((Path(work_dir) / "synthetic_ckpt.json").read_text())["step"]
    except (FileNotFoundError, ValueError):
        return 0


def _calls(work_dir: str) -> int:
    path = Path(work_dir) / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_packed_tasks_end_each_member_alone(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    members = specs(tmp_path, 6, [
        {"count_calls": True, "steps": 2, "step_s": 0.2},    # 0: done first; its task is requeued afterwards
        {"count_calls": True, "steps": 24, "step_s": 0.5},   # 1: requeued mid-run, resumes
        {"count_calls": True, **ENDLESS},                    # 2: SIGKILLed by the test
        {"count_calls": True, "steps": 12, "step_s": 0.5},   # 3: its partner killed, finishes
        {"count_calls": True, **ENDLESS},                    # 4: stopped alone (a quorum close: late)
        {"count_calls": True, "steps": 30, "step_s": 0.5},   # 5: its partner stopped, finishes
    ])
    folder = tmp_path / "launcher"
    first = SlurmLauncher(**PACKED)
    refs = [ref for part in first.submit_chunks(ENTRY, members, folder, 600) for ref in part]
    jobs = {spec.index: ref.to_dict() for spec, ref in zip(members, refs)}
    tasks = sorted({ref.job_id for ref in refs})
    slurm_cluster.submitted.append(int(tasks[0].split("_")[0]))
    assert len(tasks) == 3 and [ref.job_id for ref in refs[::2]] == [ref.job_id for ref in refs[1::2]]
    first.close()  # the orchestrator is gone; a new one resumes from jobs.json alone

    acted: dict[str, object] = {}

    def drive(runner: MemberArrayRunner) -> None:
        if "killed" not in acted and _step(members[2].work_dir) >= 2:
            ledger = read_ledger(members[2].work_dir)
            assert ledger is not None
            os.kill(ledger.pid, signal.SIGKILL)
            acted["killed"] = ledger.pid
        if "stopped" not in acted and _step(members[4].work_dir) >= 2:
            runner.stop_members([4], "late", "closed at the quorum by the test")
            acted["stopped"] = _step(members[5].work_dir)
        if "requeued" not in acted and read_result(members[0].work_dir) is not None \
                and _step(members[1].work_dir) >= 4:
            run_slurm_command(["scontrol", "requeue", jobs[1]["job_id"]])
            acted["requeued"] = True

    saved: dict[int, dict] = {}
    runner = MemberArrayRunner(SlurmLauncher(**PACKED), ENTRY, members, jobs, saved.update, folder,
                               RunnerPolicy(retries=0, timeout_s=scaled(600), kill_grace_s=30), on_tick=drive)
    final = runner.run()
    assert set(acted) == {"killed", "stopped", "requeued"}
    assert {i: r.status for i, r in final.items()} == {0: "ok", 1: "ok", 2: "failed", 3: "ok", 4: "late", 5: "ok"}
    assert saved == {} or all(saved[i]["job_id"] == jobs[i]["job_id"] for i in saved)  # re-attached, never resubmitted
    assert "SIGKILL" in final[2].error
    assert [_calls(s.work_dir) for s in members] == [1, 2, 1, 1, 1, 1]  # the requeue ran member 1 alone again
    checkpoint = json.loads((Path(members[1].work_dir) / "synthetic_ckpt.json").read_text())
    assert len(checkpoint["starts"]) == 2 and checkpoint["starts"][1] >= 4 and final[1].steps_done == 24
    assert final[5].steps_done == 30 and acted["stopped"] < 30  # member 5 went on after its partner was stopped
    # every task ends COMPLETED once its last member ended (the members' records come first; accounting lags)
    slurm_cluster.wait_for([int(tasks[0].split("_")[0])],
                           lambda rows: sorted(r.job_id for r in rows) == tasks
                           and all(r.state == "COMPLETED" for r in rows), timeout=60, what="all COMPLETED")
    share = read_gpu_share(members[5].work_dir)
    assert share is not None and share["task"] == tasks[2] and share["shared_with"] == [4]
    ref = JobRef.from_dict(jobs[4])
    assert ref.packed_with == [members[5].work_dir] and ref.work_dir == members[4].work_dir


def test_a_packed_search_has_the_centres_of_the_unpacked_one(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    """meta.run with resources.members_per_gpu=2 on the cluster (CPU members: two per task) moves its centre exactly
    as the same search with one member per job (launcher=debug, run in this process: the fitness of a member depends
    on its spec alone, and the reference is not the CLI under test)."""
    common = ["new=true", "population=4", "generations=2", "reevaluate.top_k=0", "reevaluate.report_seeds=0",
              "inner.entrypoint=meta.synthetic:member", "+inner.options.steps=2", "+inner.options.step_s=0.1"]
    done = subprocess.run([sys.executable, "-m", "meta.run", f"run_dir={tmp_path / 'packed'}", *common,
                           "launcher=slurm", "resources.members_per_gpu=2", "launcher.poll_interval_s=0.5",
                           "launcher.query_interval_s=2", "launcher.job_name=mirror-es-packed-search"],
                          cwd=ROOT, capture_output=True, text=True, timeout=scaled(600))
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([f"run_dir={tmp_path / 'alone'}", *common, "launcher=debug"]) == 0
    packed, alone = RunStore(tmp_path / "packed"), RunStore(tmp_path / "alone")
    jobs = packed.read_jobs(0)
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs.values()})
    assert len({j["job_id"] for j in jobs.values()}) == 3  # 4 members + the control in 3 tasks
    assert jobs[0]["job_id"] == jobs[1]["job_id"] and jobs[2]["job_id"] == jobs[3]["job_id"]  # pairs together
    for generation in (0, 1):
        assert torch.equal(packed.read_state(generation)["center"], alone.read_state(generation)["center"])
    members = packed.read_members()
    assert set(members["status"]) == {"ok"} and members["gpu_share"].str.startswith("task ").all()
