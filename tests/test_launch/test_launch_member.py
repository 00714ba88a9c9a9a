"""The member wrapper: every outcome becomes a record on disk, and a finished member never runs again."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from launch.member import load_program, read_ledger, run_member
from core.records import MemberSpec
from results.store.member_files import read_result

ENTRY = "meta.synthetic:member"


def _spec(tmp_path, index=0, attempt=0, **options):
    return {
        "run_id": "t", "generation": 0, "index": index, "seed": 0, "params": [0.02] * 380,
        "work_dir": str(tmp_path / f"member_{index:03d}"), "inner": {"options": {"count_calls": True, **options}},
        "attempt": attempt,
    }


def _calls(spec):
    from pathlib import Path

    path = Path(spec["work_dir"]) / "calls.log"
    return path.read_text().count("\n") if path.exists() else 0


def test_ok_member_writes_its_record_and_is_never_run_twice(tmp_path):
    spec = _spec(tmp_path)
    first = run_member(ENTRY, spec, timeout_s=10)
    assert first["status"] == "ok" and first["fitness"] == pytest.approx(1.0)
    assert read_result(spec["work_dir"]).fitness == pytest.approx(1.0)
    again = run_member(ENTRY, spec, timeout_s=10)
    assert again == first and _calls(spec) == 1


def test_exception_becomes_failed_with_the_traceback_tail(tmp_path):
    spec = _spec(tmp_path, fail=[0])
    record = run_member(ENTRY, spec, timeout_s=10)
    assert record["status"] == "failed" and "injected failure" in record["error"] and "Traceback" in record["error"]
    assert json.loads((tmp_path / "member_000" / "result.json").read_text())["status"] == "failed"


def test_nan_fitness_becomes_failed(tmp_path):
    record = run_member(ENTRY, _spec(tmp_path, nan_fitness=[0]), timeout_s=10)
    assert record["status"] == "failed" and record["fitness"] == 0.0 and "non-finite" in record["error"]


def test_hang_past_the_wall_limit_becomes_timeout(tmp_path):
    start = time.monotonic()
    record = run_member(ENTRY, _spec(tmp_path, hang=[0]), timeout_s=0.3)
    assert record["status"] == "timeout" and time.monotonic() - start < 5


def test_a_duplicate_job_waits_for_the_first_and_reuses_its_result(tmp_path):
    spec = _spec(tmp_path, sleep_s=0.5)
    results = []
    workers = [threading.Thread(target=lambda: results.append(run_member(ENTRY, spec, timeout_s=0))) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert results[0] == results[1] and _calls(spec) == 1


def test_bad_entrypoints_are_named():
    for bad, fragment in [("meta.synthetic", "module:function"), ("no_such_mod:f", "cannot import"),
                          ("meta.synthetic:nope", "no attribute"), ("meta.synthetic:CHECKPOINT_FILE", "nor callable"),
                          ("meta.synthetic:SyntheticProgram", r"MemberProgram class: name an instance of it")]:
        with pytest.raises(ValueError, match=fragment):
            load_program(bad)


def test_a_plain_function_is_a_program_without_hooks(tmp_path):
    """The simplest entry point a user may name: ``fn(spec) -> record``; the loader makes it a program whose train
    calls it and whose hooks do nothing, and two loads of it are one program (a resume compares them)."""
    program = load_program(f"{__name__}:requeue_entry")
    assert program == load_program(f"{__name__}:requeue_entry") and program != load_program(ENTRY)
    assert program.stage({}) is None and program.use_staged({"a": 1}, []) == {"a": 1}
    spec = MemberSpec.from_dict(_spec(tmp_path))
    assert program.train(spec) == {"status": "ok", "fitness": 0.5, "val_size": 1, "steps_done": 1}


def requeue_entry(spec):
    """An entry point for the ledger tests: sleeps, then ends like a run that submitit requeues (SystemExit
    from its signal handler) when ``requeue`` is set, else returns an ok record."""
    options = spec.inner.get("options", {})
    time.sleep(float(options.get("sleep_s", 0.0)))
    if options.get("requeue"):
        raise SystemExit(-1)
    return {"status": "ok", "fitness": 0.5, "val_size": 1, "steps_done": 1}


def _write_ledger(work_dir, attempt, used_s):
    from pathlib import Path

    Path(work_dir).mkdir(parents=True, exist_ok=True)
    now = time.time()
    (Path(work_dir) / "started.json").write_text(json.dumps({
        "attempt": attempt, "started_at": now - 60, "used_before_s": 0.0, "used_s": used_s, "updated_at": now - 50,
        "running": False,
    }))


def test_the_alarm_gets_the_remaining_running_time_budget_on_resume(tmp_path):
    spec = _spec(tmp_path, hang=[0])
    _write_ledger(spec["work_dir"], attempt=0, used_s=2.7)  # earlier runs of this attempt used 2.7 of 3 s
    start = time.monotonic()
    record = run_member(ENTRY, spec, timeout_s=3.0)
    took = time.monotonic() - start
    assert record["status"] == "timeout" and "earlier runs" in record["error"], record
    assert took < 1.5, took
    ledger = read_ledger(spec["work_dir"])
    assert ledger.running is False and ledger.used_before_s == pytest.approx(2.7)
    assert ledger.used_s == pytest.approx(2.7 + took, abs=0.2)


def test_a_used_up_budget_ends_the_run_at_once_and_a_new_attempt_starts_from_zero(tmp_path):
    spent = _spec(tmp_path, index=0)
    _write_ledger(spent["work_dir"], attempt=0, used_s=5.0)
    record = run_member(ENTRY, spent, timeout_s=4.0)
    assert record["status"] == "timeout" and "used up" in record["error"] and _calls(spent) == 0
    retry = _spec(tmp_path, index=1, attempt=1)
    _write_ledger(retry["work_dir"], attempt=0, used_s=5.0)  # the previous attempt's ledger
    assert run_member(ENTRY, retry, timeout_s=4.0)["status"] == "ok"
    assert read_ledger(retry["work_dir"]).used_before_s == 0.0


def test_running_time_adds_up_over_requeued_runs_and_is_refreshed_while_running(tmp_path):
    spec = _spec(tmp_path, sleep_s=0.6, requeue=True)
    entry = f"{__name__}:requeue_entry"
    seen = []
    reader = threading.Thread(target=lambda: [seen.append(read_ledger(spec["work_dir"])) or time.sleep(0.05)
                                              for _ in range(10)])
    reader.start()
    with pytest.raises(SystemExit):  # the first run is requeued: its time is recorded on the way out
        run_member(entry, spec, timeout_s=60, ledger_interval_s=0.1)
    reader.join()
    first = read_ledger(spec["work_dir"])
    assert first.running is False and first.used_s == pytest.approx(0.6, abs=0.2)
    refreshed = [s.used_s for s in seen if s is not None and s.running]
    assert len(set(refreshed)) >= 2 and refreshed == sorted(refreshed)  # refreshed every interval
    spec["inner"]["options"]["requeue"] = False  # the requeued run finishes
    assert run_member(entry, spec, timeout_s=60, ledger_interval_s=0.1)["status"] == "ok"
    total = read_ledger(spec["work_dir"])
    assert total.used_before_s == pytest.approx(first.used_s)
    assert total.used_s == pytest.approx(first.used_s + 0.6, abs=0.2) and total.running is False


def test_an_unreadable_ledger_counts_as_absent(tmp_path):
    (tmp_path / "started.json").write_text('{"attempt": 0, "used_s": "lots"')
    assert read_ledger(tmp_path) is None
    (tmp_path / "started.json").write_text(json.dumps({"attempt": 0, "used_s": "lots"}))
    assert read_ledger(tmp_path) is None


def guarded_entry(spec):
    """An entry point that, like inner_loop.member.lifecycle.train_in_process, turns every Exception of its training
    into a `failed` record of its own."""
    try:
        while True:
            time.sleep(0.05)
    except Exception as exc:  # noqa: BLE001 - the point of the test
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}


def test_the_wall_limit_is_a_timeout_even_through_an_entry_point_that_catches_every_exception(tmp_path):
    """The alarm must not be swallowed by the entry point's own error handling (the inner loop's records any
    Exception as `failed`): a member out of time is `timeout`, which retries and reports treat differently."""
    record = run_member(f"{__name__}:guarded_entry", _spec(tmp_path), timeout_s=0.3)
    assert record["status"] == "timeout", record


def requeuing_member(spec) -> dict:
    """Calls scontrol requeue as submitit's time-limit handler does (scontrol is the test's stand-in on PATH)."""
    import subprocess

    subprocess.check_call(["scontrol", "requeue", "123"])
    return {"status": "ok", "fitness": 1.0}


@pytest.mark.parametrize("how, ends", [("kill -TERM $$", "requeued"), ("exit 1", "failed")])
def test_a_requeue_whose_scontrol_the_requeue_killed_ends_the_run_without_a_record(tmp_path, monkeypatch, how, ends):
    """The requeue stops every process of the job, scontrol among them if it has not exited: the job is requeued
    all the same, and a failed record would make the requeued run return it instead of resuming. A scontrol that
    fails on its own (exit 1: no requeue) is a failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{how}\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = _spec(tmp_path)
    if ends == "requeued":
        with pytest.raises(SystemExit):
            run_member("test_launch_member:requeuing_member", spec, timeout_s=10)
        assert read_result(spec["work_dir"]) is None and read_ledger(spec["work_dir"]) is not None
    else:
        record = run_member("test_launch_member:requeuing_member", spec, timeout_s=10)
        assert record["status"] == "failed" and "scontrol" in record["error"]
