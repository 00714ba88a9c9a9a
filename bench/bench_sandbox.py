"""Throughput of the sandbox vs plain sequential `subprocess.run([python, "-c", ...])`, side by side.

Run: .venv/bin/python bench/bench_sandbox.py [--programs 256] [--workers 0]
Both sides run the same 256 small programs (a function plus three asserts) and must agree on which
pass. The sandbox side is timed from a cold start (pool creation and worker start-up included) with
full isolation required, and includes the trusted grader: each assert is evaluated in this process and
its call into the program goes through the channel to the sandboxed process (three round trips per
program), while the baseline runs program and asserts in one interpreter.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inner_loop.sandbox.pool import SandboxConfig, SandboxPool  # noqa: E402


def make_programs(count: int) -> list[tuple[str, list[str]]]:
    """Small MBPP-like programs; every fifth one is wrong so both sides must tell passes apart."""
    items = []
    for i in range(count):
        offset = 1 if i % 5 == 0 else 0
        program = f"def solve(xs):\n    return sorted(xs)[::-1][:3] + [sum(xs) + {offset}]\n"
        tests = [f"assert solve([{i}, 2, 9, 4])[0] == {max(i, 9)}",
                 "assert solve([1, 2, 3])[-1] == 6",
                 f"assert solve([{i}])[0] == {i}"]
        items.append((program, tests))
    return items


def run_baseline(python: str, items: list[tuple[str, list[str]]]) -> list[bool]:
    results = []
    for program, tests in items:
        done = subprocess.run([python, "-c", program + "\n" + "\n".join(tests) + "\n"],
                              capture_output=True, timeout=60)
        results.append(done.returncode == 0)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=256)
    parser.add_argument("--workers", type=int, default=0, help="0: automatic (two per core, at least 4)")
    args = parser.parse_args()
    items = make_programs(args.programs)
    config = SandboxConfig(require_isolation=True, workers=args.workers)
    python = config.interpreter()  # the baseline uses the same interpreter as the sandbox

    start = time.perf_counter()
    baseline = run_baseline(python, items)
    baseline_s = time.perf_counter() - start

    start = time.perf_counter()
    pool = SandboxPool(config)
    outcomes = pool.run_many(items, timeout_s=10.0)
    sandbox_s = time.perf_counter() - start
    pool.close()

    sandboxed = [o.status == "passed" for o in outcomes]
    if sandboxed != baseline:
        raise SystemExit("sandbox and baseline disagree on which programs pass")
    n = len(items)
    print(f"machine: {os.cpu_count()} CPU cores; {n} programs; {sum(baseline)} pass on both sides")
    print(f"python: {python}")
    print(f"baseline  sequential subprocess.run([python, '-c', ...]): {baseline_s:7.2f} s  "
          f"{n / baseline_s:8.1f} programs/s")
    print(f"sandbox   run_many, isolated, {len(pool._all)} workers, cold start: {sandbox_s:7.2f} s  "
          f"{n / sandbox_s:8.1f} programs/s")
    print(f"ratio sandbox/baseline: {baseline_s / sandbox_s:.2f}x")


if __name__ == "__main__":
    main()
