"""Test-level time limits that hold on a machine three times slower than the one they were set on, under the suite's
load (two pytest-xdist workers and the SLURM session on two cores).

Why: a fixed limit set from how long a command takes on one machine fails on a slower one, though nothing is wrong:
from a fresh clone on a 2-core AMD EPYC three times slower, two vLLM members hit their 600 s limit under the
suite's load (one passes alone there in 203 s). So:

- a command that trains or runs a job (minutes) is stopped only when it has shown no progress for ``quiet_s``
  (``run_with_progress``): no new output and no CPU time used by it or any process it started. A hang (a deadlock, a
  wait that never ends) is idle and caught; a slow machine is still working and is waited for;
- a fixed wait (for a file, a state, a reply) is its limit on this machine times SLOWER (``scaled``).

Standard library only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

#: how much slower than the machine the limits were set on the suite must still pass (MIRROR_ES_TEST_SLOWER overrides)
SLOWER = float(os.environ.get("MIRROR_ES_TEST_SLOWER", "3"))
#: seconds without output and without CPU time after which a command is taken as hung: the longest quiet stretch
#: of a member here (a warm-up logs only at its end: ~60 s) times SLOWER and the suite's load, with room
QUIET_S = 900.0
#: share of one core a command must use over its quiet limit to count as working (less: it waits on nothing). CPU time,
#: not output, is what a slow machine still shows: a process given a share of a core gets that share, however slow
WORKING_CORE_SHARE = 0.01
_TICKS = os.sysconf("SC_CLK_TCK")


def scaled(seconds: float) -> float:
    """A fixed wait's limit (``seconds`` on the machine it was set on), on a machine SLOWER times slower."""
    return seconds * SLOWER


def tree_cpu_s(root: int) -> float:
    """CPU seconds used by process ``root`` and every live descendant (members in sessions of their own included),
    with the children each has reaped."""
    stats: dict[int, tuple[int, float]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state, ppid, ...; utime, stime, cutime, cstime are the 12th to 15th
        stats[int(proc.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICKS)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in stats.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(stats[pid][1] for pid in tree if pid in stats)


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_with_progress(args: Sequence[str], *, quiet_s: float = QUIET_S, input: str | None = None,
                      **popen: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)``, stopped only when neither its output nor the CPU time
    of its process tree (it and every process it started) grew for ``quiet_s`` seconds; then its session is killed
    and ``subprocess.TimeoutExpired`` raised, with the output so far. ``popen``: cwd, env."""
    captured = [tempfile.TemporaryFile("w+", errors="replace") for _ in range(2)]
    with captured[0] as out, captured[1] as err:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, stdout=out,
                                stderr=err, text=True, start_new_session=True, **popen)
        try:
            if input is not None:
                proc.stdin.write(input)
                proc.stdin.close()
            seen = (-1, -1, -1.0)
            last_progress = time.monotonic()
            while proc.poll() is None:
                now = (os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size, tree_cpu_s(proc.pid))
                if now[:2] != seen[:2] or now[2] - seen[2] >= WORKING_CORE_SHARE * quiet_s:
                    seen, last_progress = now, time.monotonic()
                elif time.monotonic() - last_progress > quiet_s:
                    _kill_session(proc)
                    out.seek(0), err.seek(0)
                    raise subprocess.TimeoutExpired(args, quiet_s, output=out.read(), stderr=err.read())
                time.sleep(1.0)
        except BaseException:
            if proc.poll() is None:
                _kill_session(proc)
            raise
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), err.read())


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` once ``timeout_s`` (the limit on the machine
    it was set on) has passed on a machine SLOWER times slower."""
    limit = scaled(timeout_s)
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {limit:.0f} s")
        time.sleep(interval_s)
