"""The sandbox's worker count follows the job's CPU allocation (affinity, SLURM, cgroup quota), and a program's
time limit counts only its own run, never the time it waited for a free worker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from inner_loop.sandbox import cpu_allocation
from inner_loop.sandbox.cpu_allocation import cgroup_cpu_limit, cgroup_v1_cpu_limit, usable_cpus
from inner_loop.sandbox.pool import SandboxConfig, SandboxPool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, cpus", [("max 100000\n", None), ("100000 100000\n", 1), ("150000 100000\n", 2),
                                        ("400000 100000\n", 4), ("50000 100000\n", 1), ("garbage\n", None),
                                        ("", None)])
def test_cgroup_cpu_max_reader(tmp_path, text, cpus):
    assert cgroup_cpu_limit(_write(tmp_path, text)) == cpus


def test_cgroup_reader_tolerates_a_missing_file(tmp_path):
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None
    assert cgroup_cpu_limit(None) is None


@pytest.mark.parametrize("quota, period, cpus", [("-1", "100000", None), ("200000", "100000", 2),
                                                 ("250000", "100000", 3), ("x", "100000", None)])
def test_cgroup_v1_quota_reader(tmp_path, quota, period, cpus):
    (tmp_path / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu.cfs_period_us").write_text(period + "\n")
    assert cgroup_v1_cpu_limit(str(tmp_path)) == cpus
    assert cgroup_v1_cpu_limit(str(tmp_path / "absent")) is None and cgroup_v1_cpu_limit(None) is None


def test_usable_cpus_takes_the_tightest_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cpu_allocation, "_own_cpu_max_file", lambda: None)
    monkeypatch.setattr(cpu_allocation, "_own_cgroup_v1_cpu_dir", lambda: None)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert usable_cpus() == 64
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert usable_cpus() == 3
    assert SandboxConfig().worker_count() == 6
    quota = _write(tmp_path, "100000 100000\n")
    monkeypatch.setattr(cpu_allocation, "_own_cpu_max_file", lambda: quota)
    assert usable_cpus() == 1
    assert SandboxConfig().worker_count() == 4  # never fewer than 4: part of each run waits on set-up
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")  # unset-like values are ignored, not fatal
    monkeypatch.setattr(cpu_allocation, "_own_cpu_max_file", lambda: None)
    assert usable_cpus() == 64
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("800000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setattr(cpu_allocation, "_own_cgroup_v1_cpu_dir", lambda: str(v1))
    assert usable_cpus() == 8  # cgroup v1 quota when there is no v2 cpu.max


_ONE_CPU_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from inner_loop.sandbox.cpu_allocation import usable_cpus
    from inner_loop.sandbox.pool import SandboxConfig, SandboxPool
    items, expected = [], []
    for i in range(64):
        if i % 4 == 3:
            items.append(("def f(x):\\n    return x + 1\\n", ["assert f(1) == 3", "assert f(0) == 1"]))
            expected.append([1, "failed"])
        else:
            items.append((f"def f(x):\\n    return x * {i}\\n", [f"assert f(2) == {2 * i}", "assert f(0) == 0"]))
            expected.append([2, "passed"])
    pool = SandboxPool(SandboxConfig())
    start = time.monotonic()
    outcomes = pool.run_many(items, timeout_s=5.0)
    wall = time.monotonic() - start
    pool.close()
    print(json.dumps({"cpus": usable_cpus(), "workers": SandboxConfig().worker_count(), "wall": wall,
                      "got": [[o.passed, o.status] for o in outcomes], "expected": expected}))
""")


def test_64_programs_on_one_cpu_all_finish_and_score_right():
    """One CPU, four workers: every program stays inside its 5 s limit and scores as a quiet machine would."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    proc = subprocess.run([sys.executable, "-c", _ONE_CPU_SCRIPT], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cpus"] == 1 and report["workers"] == 4
    assert report["got"] == report["expected"], [g for g in report["got"] if g[1] not in ("passed", "failed")]


def test_time_limit_does_not_count_the_wait_for_a_worker():
    """One worker, three 1 s programs with a 1.5 s limit: the last starts ~2 s after submission yet passes."""
    pool = SandboxPool(SandboxConfig(workers=1))
    try:
        items = [("import time\ntime.sleep(1.0)\ndef f():\n    return 1\n", ["assert f() == 1"])] * 3
        start = time.monotonic()
        outcomes = pool.run_many(items, timeout_s=1.5)
        assert time.monotonic() - start >= 3.0  # they really queued behind each other
        assert [o.status for o in outcomes] == ["passed"] * 3, [o.stderr_tail for o in outcomes]
    finally:
        pool.close()
