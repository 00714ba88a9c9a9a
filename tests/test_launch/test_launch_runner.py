"""The array runner with real launchers: retries, re-attaching to live jobs after a restart, lost jobs."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from launch.factory import build_launcher
from launch.runner import AbortRun, MemberArrayRunner, RunnerPolicy
from core.records import MemberSpec

ENTRY = "meta.synthetic:member"
LOCAL = {"name": "local", "cls": "launch.local.launchers:LocalLauncher", "kill_grace_s": 5}
DEBUG = {"name": "debug", "cls": "launch.local.launchers:DebugLauncher"}


def _specs(tmp_path, n, **options):
    return [
        MemberSpec(run_id="t", generation=0, index=i, seed=0, params=[0.01 * i] * 380,
                   work_dir=str(tmp_path / f"member_{i:03d}"), inner={"options": {"count_calls": True, **options}})
        for i in range(n)
    ]


def _calls(spec) -> list[str]:
    path = Path(spec.work_dir) / "calls.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def _runner(launcher, specs, jobs, saved, tmp_path, policy=None, **kw):
    return MemberArrayRunner(
        launcher, ENTRY, specs, jobs, lambda j: saved.update({k: dict(v) for k, v in j.items()}),
        tmp_path / "submitit", policy or RunnerPolicy(retries=1, timeout_s=30, kill_grace_s=5), **kw,
    )


def test_failed_member_is_retried_and_the_attempt_is_archived(tmp_path):
    specs = _specs(tmp_path, 3, fail=[1], fail_attempts=1)
    saved: dict = {}
    records = _runner(build_launcher(DEBUG), specs, {}, saved, tmp_path).run()
    assert [r.status for r in records.values()] == ["ok", "ok", "ok"]
    assert _calls(specs[1]) == ["attempt 0", "attempt 1"] and _calls(specs[0]) == ["attempt 0"]
    assert (Path(specs[1].work_dir) / "result.attempt0.json").exists()
    assert saved[1]["attempt"] == 1


def test_retries_exhausted_gives_a_final_failure_and_abort_check_fires(tmp_path):
    specs = _specs(tmp_path, 4, fail=[0, 2])
    runner = _runner(build_launcher(DEBUG), specs, {}, {}, tmp_path, RunnerPolicy(retries=0, timeout_s=30),
                     should_abort=lambda final: "too many" if sum(not r.ok for r in final.values()) > 1 else None)
    with pytest.raises(AbortRun, match="too many"):
        runner.run()
    records = _runner(build_launcher(DEBUG), _specs(tmp_path / "b", 4, fail=[0]), {}, {}, tmp_path / "b",
                      RunnerPolicy(retries=0, timeout_s=30)).run()
    assert records[0].status == "failed" and records[1].ok


@pytest.mark.slow
def test_local_jobs_are_reattached_after_a_restart_and_lost_ones_resubmitted(tmp_path):
    specs = _specs(tmp_path, 3, sleep_s=4)
    saved: dict = {}
    first = build_launcher(LOCAL)
    refs = first.submit(ENTRY, specs, tmp_path / "submitit", 30)
    for spec, ref in zip(specs, refs):
        saved[spec.index] = ref.to_dict()
    # Simulate the job of member 2 dying (node lost) before it wrote anything.
    os.kill(int(refs[2].job_id), signal.SIGKILL)
    # A "restarted orchestrator": a new launcher object and runner that only know the saved job map.
    second = build_launcher(LOCAL)
    records = _runner(second, specs, saved, saved, tmp_path).run()
    assert all(r.ok for r in records.values())
    assert _calls(specs[0]) == ["attempt 0"] and _calls(specs[1]) == ["attempt 0"]  # re-attached, not rerun
    assert saved[2]["submissions"] == 2 and saved[0]["submissions"] == 1  # only the lost one was resubmitted


@pytest.mark.slow
def test_local_member_hanging_past_the_wall_limit_times_out(tmp_path):
    specs = _specs(tmp_path, 2, hang=[1])
    start = time.monotonic()
    records = _runner(build_launcher(LOCAL), specs, {}, {}, tmp_path, RunnerPolicy(retries=0, timeout_s=1.0)).run()
    assert records[0].ok and records[1].status == "timeout"
    assert time.monotonic() - start < 60


def test_members_added_while_the_run_runs_are_submitted_and_waited_for(tmp_path):
    """A tuner adds its next trials from on_final: they are submitted in the same run, which ends only when they
    are final too; an index already in the run is refused."""
    specs = _specs(tmp_path, 4)
    first, later = specs[:2], specs[2:]
    settled: list[int] = []
    runner: MemberArrayRunner

    def on_final(spec, record, progress):
        settled.append(spec.index)
        if spec.index == 0:
            runner.add_members(later)

    runner = _runner(build_launcher(DEBUG), first, {}, {}, tmp_path, on_final=on_final)
    records = runner.run()
    assert sorted(records) == [0, 1, 2, 3] and all(r.ok for r in records.values())
    assert sorted(settled) == [0, 1, 2, 3] and all(_calls(s) == ["attempt 0"] for s in specs)
    with pytest.raises(ValueError, match="already part of this run"):
        runner.add_members([specs[0]])


def test_on_final_may_stop_members_that_are_still_to_be_polled(tmp_path):
    """A tuner stops a failed trial's other runs from on_final, while the runner is still going through the
    members it polls this round: those must be skipped, not polled again (this raised KeyError)."""
    specs = _specs(tmp_path, 3, fail=[0])
    runner: MemberArrayRunner

    def on_final(spec, record, progress):
        if spec.index == 0:
            runner.stop_members([1, 2], "cancelled", "sibling failed")

    runner = _runner(build_launcher(DEBUG), specs, {}, {}, tmp_path, RunnerPolicy(retries=0, timeout_s=30),
                     on_final=on_final)
    records = runner.run()
    assert records[0].status == "failed"
    assert records[1].status == records[2].status == "cancelled"


@pytest.mark.parametrize("launcher", ["local", "debug", "slurm"])
def test_each_launcher_yaml_spells_the_shared_launcher_defaults(launcher):
    """One owner per default (launch/base.py); the launcher files, over their schemas, say the same values."""
    from conf_groups import load_group

    from launch.base import DEFAULT_KILL_GRACE_S, DEFAULT_MAX_LOST_RESUBMITS
    from launch.runner import RunnerPolicy
    from launch.slurm.options import SlurmOptions

    node = load_group("launcher", launcher, resolve=False)
    assert (node["kill_grace_s"], node["max_lost_resubmits"]) == (DEFAULT_KILL_GRACE_S, DEFAULT_MAX_LOST_RESUBMITS)
    assert (RunnerPolicy().kill_grace_s, SlurmOptions().max_lost_resubmits) == (DEFAULT_KILL_GRACE_S,
                                                                              DEFAULT_MAX_LOST_RESUBMITS)


def test_the_local_launcher_runs_at_most_array_parallelism_members_at_once(tmp_path):
    """A laptop's local array: members beyond launcher.array_parallelism wait for a free slot instead of sharing the
    cores (each one's running-time budget would count while it waits for CPU)."""
    specs = _specs(tmp_path, 5, sleep_s=0.5)
    saved: dict = {}
    peak: list[int] = []
    launcher = build_launcher({**LOCAL, "array_parallelism": 2})
    records = _runner(launcher, specs, {}, saved, tmp_path, on_tick=lambda r: peak.append(len(r.in_flight))).run()
    assert all(r.ok for r in records.values()) and len(saved) == 5
    assert max(peak) == 2
    assert build_launcher(LOCAL).max_in_flight == os.cpu_count()
    with pytest.raises(ValueError, match="array_parallelism=0"):
        build_launcher({**LOCAL, "array_parallelism": 0}).validate_options({"array_parallelism": 0})
