"""``python -m meta.status``: a search's state from its files, read-only, while it runs and after its orchestrator
died; the search's TensorBoard scalars; the orchestrator's live progress line and warnings."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meta.search.generation.live_watch import (GenerationSnapshot, MemberWatch, ProgressLine, all_same_warning,
                                               generation_eta)
from meta.search.run import main as run_main
from meta.status.view import main as status_main, render
from results.store.layout import TENSORBOARD_DIR
from results.store.member_files import MemberProgress, write_result
from core.records import ResultRecord
from results.store.run_store import RunStore
from results.report.search.tensorboard import log_missing, logged_generations, write_generation

ROOT = Path(__file__).resolve().parents[3]
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "reevaluate.top_k=0"]

# A member process that holds its running-time ledger and reports step 3 of 10 at 2 s per step, then waits.
RUNNING_MEMBER = """
import sys, time
from pathlib import Path
from launch.member import running_time_ledger
from results.store.member_files import MemberProgress, write_progress
work_dir = Path(sys.argv[1])
with running_time_ledger(work_dir, 0, 1.0):
    now = time.time()
    write_progress(work_dir, MemberProgress(step=3, max_steps=10, started_at=now - 6, updated_at=now,
                   seconds_per_step=2.0, reward_mean=0.25, zero_std_fraction=0.5, regularizer_grad_share=0.05))
    print("ready", flush=True)
    time.sleep(120)
"""

HOLD_LOCK = """
import sys, time
from meta.search.lock import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def _child(script: str, arg: Path, ready: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, str(arg)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == ready
    return proc


def test_status_of_a_finished_search_and_of_a_generation_in_flight(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=1"]) == 0
    store = RunStore(run_dir)
    text = render(run_dir)
    assert "generation 1 of 1 done" in text and "gen 0: 5 ok" in text and "(control)" in text
    assert "orchestrator: not running" in text

    # Generation 1 in flight, as the files of a live search show it: member 0 running (a real process keeps its
    # ledger), 1 failed, 2 late, 3 finished ok in 20 s, 4 (the control) submitted and waiting in the queue.
    store.write_population(1, store.read_population(0))
    store.write_jobs(1, {i: {"job_id": str(1000 + i), "folder": "x", "attempt": 0, "submissions": 1} for i in range(5)})
    for i in range(5):
        store.member_dir(1, i).mkdir(parents=True)
    write_result(store.member_dir(1, 1), ResultRecord(status="failed", error="RuntimeError: CUDA out of memory"))
    write_result(store.member_dir(1, 2), ResultRecord(status="late", error="generation closed at its quorum"))
    write_result(store.member_dir(1, 3), ResultRecord(status="ok", fitness=0.5, wall_time_s=20.0))
    member = _child(RUNNING_MEMBER, store.member_dir(1, 0), "ready")
    try:
        text = render(run_dir)
    finally:
        member.kill()
        member.wait()
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("  member")}
    assert "running" in lines["000"] and "step 3/10, reward 0.250, grad share 0.05" in lines["000"]
    assert "failed" in lines["001"] and "CUDA out of memory" in lines["001"]
    assert "late" in lines["002"] and "ok" in lines["003"] and "fitness 0.5000" in lines["003"]
    assert "queued" in lines["004"] and "job 1004" in lines["004"]
    # ETA: the running member's 7 steps at 2 s, then the queued one at the finished members' median (20 s)
    assert "gen 1: 1 failed, 1 late, 1 ok, 1 queued, 1 running | best 0.5000" in text
    assert "ETA 0m34s" in text
    assert status_main([f"run_dir={run_dir}"]) == 0
    assert "gen 1:" in capsys.readouterr().out
    assert status_main([str(tmp_path / "nothing")]) == 2


def test_status_tells_a_live_orchestrator_from_a_dead_one(tmp_path):
    run_dir = tmp_path / "run"
    assert run_main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=1"]) == 0
    holder = _child(HOLD_LOCK, RunStore(run_dir).lock_path, "held")
    try:
        assert f"orchestrator: alive (held by another orchestrator (pid {holder.pid}" in render(run_dir)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    text = render(run_dir)
    assert "orchestrator: not running" in text and "dead orchestrator" in text
    assert RunStore(run_dir).lock_path.exists()  # status only looked: the dead holder's file is still there


def test_the_search_writes_its_scalars_per_generation_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    assert run_main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=2"]) == 0
    store = RunStore(run_dir)
    assert logged_generations(run_dir) == {0, 1}
    assert log_missing(store) == []  # a resume writes nothing twice...
    for path in (run_dir / TENSORBOARD_DIR).glob("*gen0001"):
        path.unlink()
    assert log_missing(store) == [1]  # ...and backfills what a crash lost
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"fitness/mean", "fitness/median", "fitness/max", "fitness/std", "fitness/control", "search/center_norm",
            "search/spread", "members/failed", "members/late", "time/generation_wall_s"} <= tags
    means = events.Scalars("fitness/mean")
    assert [e.step for e in means] == [0, 1]
    members = store.read_members()
    ok = members[(members["generation"] == 1) & (members["role"] == "member")]["fitness"]
    assert means[1].value == pytest.approx(ok.mean(), rel=1e-6)
    control = members[(members["generation"] == 0) & (members["role"] == "control")]["fitness"].iloc[0]
    assert events.Scalars("fitness/control")[0].value == pytest.approx(control, rel=1e-6)


def test_the_progress_line_is_rate_limited_but_never_silent(caplog):
    now = [0.0]
    line = ProgressLine(min_interval_s=60, max_interval_s=600, clock=lambda: now[0])

    def snap(done: int) -> GenerationSnapshot:
        return GenerationSnapshot(0, 10, done, 2, 8 - done, 0, 0, 0.5 if done else None, 0.4 if done else None, 90.0)

    assert line.maybe_log(snap(0))
    now[0] = 30
    assert not line.maybe_log(snap(1))  # changed, but within a minute
    now[0] = 61
    assert line.maybe_log(snap(1))
    now[0] = 300
    assert not line.maybe_log(snap(1))  # nothing changed
    now[0] = 662
    assert line.maybe_log(snap(1))  # hours of queueing are not silence
    assert "gen 0: done 1/10, running 2, queued 7, failed 0, late 0 | best 0.5000, mean 0.4000 | generation ETA 1m30s" \
        in caplog.text


def test_members_that_learn_nothing_or_have_an_inert_regularizer_are_warned_about_once():
    watch = MemberWatch(grad_share_floor=0.01, streak=3)

    def progress(zero: list[float], share: list[float]) -> MemberProgress:
        return MemberProgress(step=len(zero), max_steps=10, started_at=0, updated_at=1, zero_std_recent=zero,
                              grad_share_recent=share)

    assert watch.check("m1", progress([1.0, 1.0], [0.001, 0.001])) == []  # no streak yet
    warned = watch.check("m1", progress([1.0, 0.97, 1.0], [0.001, 0.002, 0.001]))
    assert len(warned) == 2 and "all-equal rewards" in warned[0] and "grad_share_floor=0.01" in warned[1]
    assert watch.check("m1", progress([1.0, 1.0, 1.0], [0.001] * 3)) == []  # once per member
    assert watch.check("m2", progress([0.5, 1.0, 1.0], [0.02, 0.03, 0.05])) == []
    assert "all 4 finished members scored 0.2500" in all_same_warning(3, [0.25] * 4)
    assert all_same_warning(3, [0.25, 0.5]) is None


def test_generation_eta_from_step_rates_and_finished_times():
    running = [MemberProgress(step=3, max_steps=10, started_at=0, updated_at=0, seconds_per_step=2.0)]
    assert generation_eta([20.0, 40.0], running, 0, None) == 14.0
    assert generation_eta([20.0, 40.0], running, 5, 2) == 14.0 + 3 * 30.0  # 5 queued on 2 free slots: 3 waves
    assert generation_eta([], running, 1, None) is None  # nothing finished: a queued member's time is unknown


def test_a_backfilled_generation_keeps_every_generations_points_in_tensorboard(tmp_path):
    """A generation written after its successors (a resume's backfill) must not make TensorBoard drop them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for generation in (0, 2, 3, 1):  # generation 1's file was lost and is written again last
        write_generation(tmp_path, generation, {"fitness/mean": 0.1 * (generation + 1)})
    assert logged_generations(tmp_path) == {0, 1, 2, 3}
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    means = events.Scalars("fitness/mean")
    assert [e.step for e in means] == [0, 1, 2, 3]
    assert [e.value for e in means] == pytest.approx([0.1, 0.2, 0.3, 0.4])
