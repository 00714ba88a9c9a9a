"""The member wrapper: every outcome becomes a record on disk, and a finished member never runs again."""
from __future__ import annotations

import json
import threading
import time

import pytest

from launch.member import load_entrypoint, run_member
from results.records import read_result

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
                          ("meta.synthetic:nope", "no attribute")]:
        with pytest.raises(ValueError, match=fragment):
            load_entrypoint(bad)
