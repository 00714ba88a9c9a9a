"""The function every job runs: call ``inner.entrypoint`` on a member spec and persist its outcome.

It makes members safe to submit more than once: a member whose result.json holds a final status is returned
without running again, and an exclusive lock on the member directory makes a duplicate job (an orphan of a
killed orchestrator plus its resubmission) wait and then read the first one's result instead of training
twice. Every Python-level outcome (exception, NaN fitness, wall-limit exceeded) becomes a result record, so
a job that leaves no result.json died from outside (killed, out of memory, node lost).

This module must stay light: it runs in every member process and must not import torch.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import logging
import os
import signal
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from results.records import MemberSpec, ResultRecord, read_result, write_result

logger = logging.getLogger(__name__)

STARTED_FILE = "started.json"
LOCK_FILE = ".member.lock"
ERROR_TAIL_CHARS = 4000


class MemberTimeout(Exception):
    """Raised inside a member that ran past inner.timeout_s."""


def load_entrypoint(entrypoint: str) -> Callable[..., Any]:
    """Resolve ``"package.module:function"``; ValueError naming the problem otherwise."""
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"inner.entrypoint {entrypoint!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"inner.entrypoint {entrypoint!r}: cannot import module {module_name!r} ({exc})") from exc
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"inner.entrypoint {entrypoint!r}: {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"inner.entrypoint {entrypoint!r} is not callable")
    return fn


@contextlib.contextmanager
def member_lock(work_dir: Path) -> Iterator[None]:
    """Exclusive flock on the member directory (released by the kernel if the process dies)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with open(work_dir / LOCK_FILE, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def wall_limit(seconds: float) -> Iterator[None]:
    """Raise MemberTimeout in the main thread after ``seconds`` (no-op off the main thread or if <= 0)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _on_alarm(signum: int, frame: Any) -> None:
        raise MemberTimeout(f"member exceeded inner.timeout_s={seconds:g}")

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_member(
    entrypoint: str,
    spec: Mapping[str, Any],
    timeout_s: float,
    out_of_time: tuple[type[BaseException], ...] = (),
) -> dict[str, Any]:
    """Run one member to a final ResultRecord (as a dict), written to ``<work_dir>/result.json``.

    ``out_of_time``: extra exception types that mean "ran out of wall time" (status ``timeout``), e.g. the
    one submitit raises in a SLURM job that used up its requeues."""
    member = MemberSpec.from_dict(spec)
    work_dir = Path(member.work_dir)
    with member_lock(work_dir):
        finished = read_result(work_dir)
        if finished is not None:
            return finished.to_dict()
        _write_started(work_dir, member.attempt)
        start = time.monotonic()
        record = _call(entrypoint, member, timeout_s, out_of_time)
        if record.wall_time_s <= 0:
            record.wall_time_s = time.monotonic() - start
        write_result(work_dir, record)
    return record.to_dict()


def _write_started(work_dir: Path, attempt: int) -> None:
    """Start marker for the orchestrator's wall-limit check: atomic (replace) but not fsynced, since losing
    it in a crash only delays that check, and an fsync per member start is paid by every member."""
    marker = {"time": time.time(), "attempt": attempt, "pid": os.getpid(), "host": socket.gethostname()}
    tmp = work_dir / f".{STARTED_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(marker))
    os.replace(tmp, work_dir / STARTED_FILE)


def _call(
    entrypoint: str, member: MemberSpec, timeout_s: float, out_of_time: tuple[type[BaseException], ...] = ()
) -> ResultRecord:
    try:
        with wall_limit(timeout_s):
            fn = load_entrypoint(entrypoint)
            raw = fn(member)
            return ResultRecord.coerce(raw)
    except (MemberTimeout, *out_of_time) as exc:
        return ResultRecord(status="timeout", error=str(exc))
    except Exception:  # any member failure becomes a record; the orchestrator decides about retries
        tail = traceback.format_exc()[-ERROR_TAIL_CHARS:]
        return ResultRecord(status="failed", error=tail)
