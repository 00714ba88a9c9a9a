"""Programs the sandbox tests run as model-written code (tests/test_inner_loop/sandbox/test_sandbox_adversarial.py,
tests/test_inner_loop/member/test_preflight.py)."""
from __future__ import annotations


def fork_counter(attempts: int, child_sleep_s: int) -> str:
    """A program that forks up to ``attempts`` children, each sleeping ``child_sleep_s`` seconds, stops at the first
    refused fork, and prints ``forked <n>`` to stderr (where the grader's outcome keeps it), leaving ``n`` defined
    for the tests that follow it."""
    return f"""import os, sys, time
n = 0
for _ in range({attempts}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep({child_sleep_s})
        os._exit(0)
    n += 1
print("forked", n, file=sys.stderr)
"""
