"""Batches run back to back on one pool: wrong programs come back `failed`, never `crashed`.

Regression: workers started from run_many's short-lived threads were killed by bwrap's
--die-with-parent when those threads ended, so the next batch reported ordinary programs as crashed.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from inner_loop.sandbox.pool import SandboxConfig, SandboxPool

CHECK = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\ncheck(square)\n"


def _mixed_batch(size: int) -> tuple[list[tuple[str, list[str]]], list[int], list[str]]:
    """HumanEval-like items: a right solution, a `return None` one, and a half-right MBPP-like one."""
    items, passed, statuses = [], [], []
    for i in range(size):
        kind = i % 3
        if kind == 0:
            items.append(("def square(x):\n    return x * x\n", [CHECK]))
            passed.append(1), statuses.append("passed")
        elif kind == 1:
            items.append(("def square(x):\n    return None\n", [CHECK]))
            passed.append(0), statuses.append("failed")
        else:
            items.append((f"def square(x):\n    return x * x + {i % 2}\n",
                          ["assert square(0) == 0", "assert square(2) == 4", "assert square(1) >= 1"]))
            passed.append(3 if i % 2 == 0 else 1), statuses.append("passed" if i % 2 == 0 else "failed")
    return items, passed, statuses


@pytest.fixture
def pool():
    pool = SandboxPool(SandboxConfig(workers=3))
    yield pool
    pool.close()


def test_back_to_back_batches_never_crash(pool, caplog):
    caplog.set_level(logging.WARNING, logger="inner_loop.sandbox.pool")
    items, passed, statuses = _mixed_batch(12)
    for _ in range(5):
        outcomes = pool.run_many(items, timeout_s=10.0)
        assert [o.status for o in outcomes] == statuses
        assert [o.passed for o in outcomes] == passed
    assert not [r for r in caplog.records if "worker failed" in r.getMessage()]


def test_workers_outlive_the_thread_that_started_them(pool):
    """A worker is only useful warm: the thread that first used it ending must not kill it."""
    items, passed, _ = _mixed_batch(3)
    starter = threading.Thread(target=pool.run_many, args=(items,), kwargs={"timeout_s": 10.0})
    starter.start()
    starter.join()
    # white-box: the very processes started in that thread must still be the ones answering
    started = [(worker, worker._proc.pid) for worker in pool._all if worker._proc is not None]
    assert started
    time.sleep(0.5)  # time for a parent-death signal to land, if one was sent
    assert all(worker._proc.poll() is None for worker, _ in started)
    outcomes = pool.run_many(items, timeout_s=10.0)
    assert [o.passed for o in outcomes] == passed
    assert all(worker._proc is not None and worker._proc.pid == pid for worker, pid in started)
