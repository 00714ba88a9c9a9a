"""The processes of ``launcher=local``: submitit's controller (one per member; its pid is the job id) and the
member it runs. Why this module: stopping them must work however the orchestrator was started.

submitit stops a local job with SIGINT to the controller, which then stops its member (SIGINT, 1 s, SIGKILL).
Two cases defeat that on Linux:

- an orchestrator started in the background by a script (``nohup python -m meta.run ... &`` in a script
  or a subshell) inherits SIGINT *ignored*, and an ignored signal stays ignored across exec: every
  controller it starts ignores SIGINT, so a straggler closed at the quorum or a pruned trial goes on training
  (and holding its GPU) until its time limit;
- a controller started by an earlier orchestrator process (a resumed run) cannot be reached through a submitit
  handle, and SIGTERM is no substitute: the controller forwards it to the member, whose submitit job
  environment ignores it.

So controllers are started with SIGINT at its default (``sigint_deliverable_to_children``), and a job is stopped
by ``stop_controllers``: SIGINT to the controller and every process below it (the member, its sandbox) where the
controller accepts SIGINT, otherwise SIGKILL to all of them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from core.proc_stat import proc_stat

logger = logging.getLogger(__name__)

_CONTROLLER_MODULE = b"submitit.local._local"
#: Linux: processes are read from /proc; elsewhere (macOS) only what os.kill can tell
_HAS_PROC = Path("/proc/self").exists()


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing: to this process SIGINT stays ignored, but unlike SIG_IGN a Python-level
    handler is reset to the default in a child at exec, so the child can be interrupted."""


@contextlib.contextmanager
def sigint_deliverable_to_children() -> Iterator[None]:
    """Processes started inside this block get SIGINT at its default even if this process ignores it.

    Only SIG_IGN is passed on across exec; a handler is not. Where SIGINT is ignored here, a no-op handler
    replaces SIG_IGN for the block (the same behaviour for this process) and SIG_IGN is put back after.
    Signal dispositions can only be changed from the main thread; elsewhere the block changes nothing and
    ``stop_controllers`` falls back to killing the process tree."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        logger.debug("SIGINT is ignored and this is not the main thread: local members inherit the ignore")
        yield
        return
    signal.signal(signal.SIGINT, _ignore)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def controller_running(job_id: str) -> bool:
    """Is ``job_id`` (a local controller pid) a live, non-zombie submitit controller?"""
    try:
        pid = int(job_id)
    except ValueError:
        return False
    if _HAS_PROC:
        fields = proc_stat(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return False
        return bool(fields) and fields[0] not in ("Z", "X") and _CONTROLLER_MODULE in cmdline
    try:  # no /proc (macOS): best effort
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop_controllers(job_ids: Sequence[str]) -> None:
    """Stop the local jobs whose controller pids are ``job_ids``, and their members, without waiting.

    A controller and every process below it get SIGINT where the controller accepts it (submitit's own
    cancel; the controller then SIGKILLs its member after 1 s), SIGKILL where it ignores SIGINT. The member is
    signalled directly too: a SIGINT that reaches the controller while it is starting the member leaves the
    member out of the controller's list, and the member would run on alone."""
    pids = [int(job_id) for job_id in job_ids if controller_running(job_id)]
    if not pids:
        return
    if not _HAS_PROC:
        for pid in pids:
            _signal(pid, signal.SIGINT)
        return
    children = _children_by_parent()
    for pid in pids:
        below = _descendants(pid, children)
        signum = signal.SIGKILL if _ignores_sigint(pid) else signal.SIGINT
        if signum == signal.SIGKILL:
            logger.info("local job %d ignores SIGINT; killing it and its %d process(es)", pid, len(below))
        for target in [pid, *below]:  # the controller first, so that it starts nothing more
            _signal(target, signum)


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """Every process below ``pid`` in the map parent -> children (children first)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        level = [child for parent in frontier for child in children.get(parent, [])]
        found.extend(level)
        frontier = level
    return found


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, read from /proc once for all the jobs of one cancel."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields and len(fields) > 1:  # None: not a process, or gone meanwhile
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _ignores_sigint(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass  # ended meanwhile
