"""The orchestrator's hard time limit counts running time only (issue 13, item 2).

``inner.timeout_s`` is one attempt's budget of RUNNING time summed over its runs (requeues); time spent
queued never counts. The member keeps the ledger (started.json); here a scripted launcher plays the
scheduler (queued / running / cancelled) and writes the ledger the way each run of the member would.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launch.base import JobRef, Launcher
from launch.runner import MemberArrayRunner, RunnerPolicy
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result, write_result

ENTRY = "meta.synthetic:member"


def _ledger(work_dir: Path, started_ago: float, used_before: float, used: float, running: bool,
            updated_ago: float = 0.0, interval_s: float = 1.0) -> None:
    """started.json as a member run writes it; ``time`` is the start-marker key the file had before the ledger."""
    work_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (work_dir / "started.json").write_text(json.dumps({
        "attempt": 0, "started_at": now - started_ago, "used_before_s": used_before, "used_s": used,
        "updated_at": now - updated_ago, "running": running, "interval_s": interval_s, "time": now - started_ago,
    }))


class Scheduler(Launcher):
    """One job per member: queued while ``queued_until`` (monotonic) lies ahead, then ``on_start`` runs once;
    alive until cancelled or until ``on_progress`` ends it. ``reason``: the pending reason ``waiting`` reports
    (launch.base: only reasons that mean a job may never start), or None for a wait it does not report
    (priority, resources)."""

    poll_interval_s = 0.02

    def __init__(self, queued_for: float = 0.0, on_start=None, on_progress=None,
                 reason: str | None = "PENDING, ReqNodeNotAvail") -> None:
        super().__init__()
        self.queued_until = time.monotonic() + queued_for
        self.reason = reason
        self.on_start = on_start
        self.on_progress = on_progress
        self.started = False
        self.live: set[str] = set()
        self.cancelled: list[str] = []

    def submit(self, entrypoint, specs, folder, timeout_s):
        refs = [JobRef(job_id=f"job-{s.index}", folder=str(folder), attempt=s.attempt) for s in specs]
        self.live.update(r.job_id for r in refs)
        return refs

    def is_alive(self, ref: JobRef) -> bool:
        return ref.job_id in self.live

    def waiting(self, refs) -> dict[str, str]:
        if time.monotonic() >= self.queued_until or self.reason is None:
            return {}
        return {r.job_id: self.reason for r in refs if r.job_id in self.live}

    def progress(self) -> None:
        if time.monotonic() < self.queued_until:
            return
        if not self.started and self.on_start is not None:
            self.on_start()
        self.started = True
        if self.on_progress is not None and self.on_progress():
            self.live.clear()

    def cancel(self, refs) -> None:
        for ref in refs:
            self.cancelled.append(ref.job_id)
            self.live.discard(ref.job_id)


def _spec(tmp_path: Path) -> MemberSpec:
    return MemberSpec(run_id="t", generation=0, index=0, seed=0, params=[0.02] * 4,
                      work_dir=str(tmp_path / "member_000"), inner={})


def _run(launcher: Launcher, spec: MemberSpec, tmp_path: Path, timeout_s: float, kill_grace_s: float) -> ResultRecord:
    policy = RunnerPolicy(retries=0, timeout_s=timeout_s, kill_grace_s=kill_grace_s, result_scan_interval_s=0.05,
                          max_lost_resubmits=0)
    return MemberArrayRunner(launcher, ENTRY, [spec], {}, lambda jobs: None, tmp_path / "submitit", policy).run()[0]


@pytest.mark.parametrize("reason", ["PENDING, ReqNodeNotAvail", None], ids=["reported", "unreported"])
@pytest.mark.parametrize("ended", ["requeued_itself", "killed_hard"])
def test_a_requeued_member_queued_longer_than_its_budget_is_not_cancelled(tmp_path, ended, reason):
    """Its first run used 0.2 s and ended 30 s ago (by its own requeue: ledger closed; or killed: ledger left
    "running", refreshed every 1 s), against a budget of 15 s + 0.3 s grace: the job has been queued since,
    and waits 1.5 s more, reported by the launcher as pending (a node down) or not at all (priority). Once it
    runs again the new run takes 0.4 s to start up before it writes its own ledger, then finishes."""
    spec = _spec(tmp_path)
    work_dir = Path(spec.work_dir)
    _ledger(work_dir, started_ago=30.0, used_before=0.0, used=0.2, running=ended == "killed_hard", updated_ago=29.8)
    begun: list[float] = []

    def run_again() -> bool:
        if not begun:
            begun.append(time.monotonic())
        elapsed = time.monotonic() - begun[0]
        if elapsed >= 0.4 and not (work_dir / "result.json").exists():
            _ledger(work_dir, started_ago=elapsed - 0.4, used_before=0.2, used=0.2 + elapsed - 0.4, running=True)
        if elapsed >= 0.6:
            write_result(work_dir, ResultRecord(status="ok", fitness=0.9))
            return True
        return False

    launcher = Scheduler(queued_for=1.5, on_progress=run_again, reason=reason)
    record = _run(launcher, spec, tmp_path, timeout_s=15.0, kill_grace_s=0.3)
    assert launcher.cancelled == [] and record.status == "ok", record.error
    assert read_result(work_dir).status == "ok"


def test_a_member_whose_runs_add_up_past_the_budget_is_cancelled(tmp_path):
    """Earlier runs used 4.5 s of a 5 s budget; the current run hangs. The limit (5 s + 0.5 s grace) is
    reached ~1 s into this run, long before 5.5 s of this run alone."""
    spec = _spec(tmp_path)
    _ledger(Path(spec.work_dir), started_ago=0.0, used_before=4.5, used=4.5, running=True)
    launcher = Scheduler()
    start = time.monotonic()
    record = _run(launcher, spec, tmp_path, timeout_s=5.0, kill_grace_s=0.5)
    took = time.monotonic() - start
    assert launcher.cancelled == ["job-0"]
    assert record.status == "timeout" and "running time" in record.error and "queued does not count" in record.error
    assert 0.8 < took < 3.0, took
    assert read_result(spec.work_dir).status == "timeout"


def test_queued_time_of_a_running_ledger_is_not_counted_once_the_job_is_seen_queued(tmp_path):
    """A run killed hard leaves its ledger "running"; while the scheduler reports the job queued, and after,
    until the next run writes, the runner counts only what that run recorded plus time since the queue."""
    spec = _spec(tmp_path)
    _ledger(Path(spec.work_dir), started_ago=3.0, used_before=0.0, used=0.5, running=True, updated_ago=2.5)
    polls = []
    launcher = Scheduler(queued_for=0.5, on_progress=lambda: polls.append(1) or len(polls) > 20)
    record = _run(launcher, spec, tmp_path, timeout_s=1.0, kill_grace_s=0.3)
    # the job "ends" without a result after ~20 polls (0.4 s): lost, not cancelled for time
    assert launcher.cancelled == []
    assert record.status == "failed" and "without writing a result" in record.error, record.error


def test_a_running_ledger_counts_at_most_one_interval_past_its_last_refresh(tmp_path):
    """A ledger not refreshed for long belongs to a run that died without a last write: a job the launcher
    does not report as queued (priority, or held by its array's own limit) is not charged for the gap
    beyond one interval (10 s) and the slack (10 s): 2 + 20 s < 100 s."""
    spec = _spec(tmp_path)
    work_dir = Path(spec.work_dir)
    work_dir.mkdir(parents=True)
    now = time.time()
    (work_dir / "started.json").write_text(json.dumps({
        "attempt": 0, "started_at": now - 500, "used_before_s": 0.0, "used_s": 2.0, "updated_at": now - 498,
        "running": True, "interval_s": 10.0, "time": now - 500,
    }))
    polls = []
    launcher = Scheduler(on_progress=lambda: polls.append(1) or len(polls) > 20)
    record = _run(launcher, spec, tmp_path, timeout_s=100.0, kill_grace_s=1.0)
    assert launcher.cancelled == [] and record.status == "failed"
