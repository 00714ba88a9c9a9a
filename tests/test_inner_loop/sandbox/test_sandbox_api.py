"""The sandbox's public contract: outcome counting, statuses, argument checks, the isolation switch."""

from __future__ import annotations

import logging

import pytest

import inner_loop.sandbox.pool as sandbox
from inner_loop.sandbox import isolation as sandbox_isolation
from inner_loop.sandbox.pool import (
    Outcome,
    SandboxConfig,
    SandboxPool,
    SandboxUnavailableError,
    run_many,
    run_program,
)


def test_run_program_counts_each_completed_snippet():
    program = "def add(a, b):\n    return a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"]
    outcome = run_program(program, tests)
    assert (outcome.passed, outcome.total, outcome.status) == (2, 3, "failed")
    assert "AssertionError" in outcome.stderr_tail
    assert outcome.fraction_passed == pytest.approx(2 / 3) and not outcome.solved


def test_humaneval_style_snippet_and_program_error():
    program = "def inc(x):\n    return x + 1\n"
    check = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\ncheck(inc)\n"
    assert run_program(program, [check]) == Outcome(1, 1, "passed", "")
    broken = run_program("def inc(x):\n    return x +\n", [check])
    assert (broken.passed, broken.status) == (0, "failed") and "SyntaxError" in broken.stderr_tail


def test_run_many_keeps_order_and_runs_concurrently():
    items = [(f"v = {i}\n", [f"assert v == {i}", "assert v % 2 == 0"]) for i in range(12)]
    outcomes = run_many(items, timeout_s=10.0)
    assert [o.passed for o in outcomes] == [2 if i % 2 == 0 else 1 for i in range(12)]
    assert [o.status for o in outcomes] == ["passed" if i % 2 == 0 else "failed" for i in range(12)]


def test_programs_do_not_see_each_other():
    first = run_program("open('state.txt', 'w').write('left over')\n", ["assert True"])
    second = run_program("import os\nfiles = os.listdir('.')\n", ["assert files == []"])
    assert first.status == "passed" and second.status == "passed"


@pytest.mark.parametrize("kwargs, message", [
    ({"program": 3, "tests": ["assert True"]}, "program must be a str"),
    ({"program": "", "tests": []}, "non-empty list"),
    ({"program": "", "tests": "assert True"}, "non-empty list"),
    ({"program": "", "tests": ["assert True"], "timeout_s": 0}, "timeout_s"),
])
def test_bad_arguments_are_rejected_before_running(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_program(**kwargs)


@pytest.mark.parametrize("field, value", [("memory_mb", 0), ("max_processes", -1), ("workers", -2),
                                          ("python", "python3"), ("require_isolation", "yes")])
def test_bad_config_names_the_key(field, value):
    with pytest.raises(ValueError, match=f"sandbox.{field}"):
        SandboxConfig(**{field: value})


@pytest.fixture
def no_bwrap(monkeypatch):
    """Pretend bubblewrap is missing (as on some clusters)."""
    sandbox_isolation.probe_isolation.cache_clear()
    monkeypatch.setattr(sandbox_isolation.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox, "_warned_fallback", False)
    yield
    sandbox_isolation.probe_isolation.cache_clear()


def test_require_isolation_refuses_without_bwrap(no_bwrap):
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        SandboxPool(SandboxConfig(require_isolation=True, workers=1))


def test_fallback_warns_once_and_still_limits(no_bwrap, caplog, monkeypatch):
    monkeypatch.setenv("MIRROR_ES_FALLBACK_SECRET", "hidden")
    caplog.set_level(logging.WARNING, logger="inner_loop.sandbox.pool")
    pool = SandboxPool(SandboxConfig(workers=2))
    SandboxPool(SandboxConfig(workers=1)).close()
    try:
        assert not pool.isolated
        warnings = [r.getMessage() for r in caplog.records if "WITHOUT full isolation" in r.getMessage()]
        assert len(warnings) == 1 and "network" in warnings[0] and "read-only" in warnings[0]
        outcomes = pool.run_many([
            ("def f():\n    return 1\n", ["assert f() == 1"]),
            ("import os\nos._exit(0)\n", ["assert True"]),
            ("import sys\nsys.exit(0)\n", ["assert True"]),
            ("while True:\n    pass\n", ["assert True"]),
            ("x = bytearray(50 * 10**9)\n", ["assert True"]),
            # tests run in the grader, so the program's view of its environment is sent out as data
            ("import os\nprint(dict(os.environ))\nseen = 'MIRROR' in str(os.environ)\n", ["assert seen is False"]),
        ], timeout_s=2.0)
        assert [o.status for o in outcomes] == ["passed", "crashed", "failed", "timeout", "out_of_memory",
                                                "passed"]
    finally:
        pool.close()


def test_isolated_pool_is_used_here():
    pool = SandboxPool(SandboxConfig(require_isolation=True, workers=1))
    assert pool.isolated
    pool.close()


def test_worker_count_follows_the_cpus_this_process_may_use_not_the_node(monkeypatch):
    """Under SLURM a member gets a few CPUs of a big node; the sandbox sizes its pool from the affinity mask."""
    import os

    from inner_loop.sandbox.pool import SandboxConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 128)  # a big node
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {sorted(before)[0]})
        assert SandboxConfig().worker_count() == 4  # max(4, 2 x 1 CPU)
    finally:
        os.sched_setaffinity(0, before)
