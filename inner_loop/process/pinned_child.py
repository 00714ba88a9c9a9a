"""Starting a pinned child (``run_pinned_child``): forked by this process's fork server where one serves it
(inner_loop/process/fork_server.py), else a fresh interpreter under PINNED_ENV (inner_loop/process/pinned.py). Apart
from pinned.py, which imports nothing of ours and must stay importable before torch."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Callable, Mapping

import inner_loop.process.fork_server as fork_server
from inner_loop.process.pinned import pinned_child_env, start_dying_with_parent


def run_pinned_child(module: str, payload: Mapping[str, Any], kill_grace_s: float = 10.0,
                     started: Callable[[subprocess.Popen | fork_server.ForkedChild], None] | None = None,
                     forkable: bool = True) -> tuple[int, str]:
    """Run ``python -m module`` with PINNED_ENV, ``payload`` as JSON on its stdin; (exit status, its stdout).

    For a pinned run asked of a process that already loaded torch under other settings (a test, the debug
    launcher, a CLI). Its log goes to this process's stderr. Whatever interrupts the wait (a member's wall-time
    alarm, Ctrl-C, a cancel) stops the child first, then propagates. ``started`` is told the child's process
    (a member forwards its job's end notice to it). Forked by the fork server (inner_loop/process/fork_server.py)
    where one serves this process and ``forkable`` (the child needs no vLLM), else a fresh interpreter."""
    env = pinned_child_env()
    proc = fork_server.start_forked(module, env) if forkable else None
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, preexec_fn=start_dying_with_parent)
    if started is not None:
        started(proc)
    try:
        out, _ = proc.communicate(json.dumps(payload).encode())
        return proc.returncode, out.decode(errors="replace")
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=kill_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
