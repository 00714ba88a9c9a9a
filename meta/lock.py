"""One orchestrator per run directory.

The lock is an flock on run_dir/LOCK, so the kernel releases it when the holder dies (even by SIGKILL): a
stale lock from a dead process never blocks a resume. The file also names the holder (host, pid, start time)
for the error message and so a leftover from a dead process is reported as such.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)


class RunLockedError(RuntimeError):
    """Another live orchestrator holds the run directory."""


class RunLock:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(self.path)
            handle.close()
            raise RunLockedError(
                f"{self.path.parent} is in use by another orchestrator ({_describe(holder)}); "
                "wait for it to finish or stop it before resuming"
            ) from None
        previous = _read_holder(self.path)
        if previous and not _same_process_alive(previous):
            logger.warning("found a stale lock from a dead orchestrator (%s); taking over", _describe(previous))
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}))
        handle.flush()
        os.fsync(handle.fileno())
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.seek(0)
            self._handle.truncate()
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _read_holder(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text() or "null")
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _same_process_alive(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder.get("pid", -1)), 0)
    except (OSError, ValueError):
        return False
    return True


def _describe(holder: dict | None) -> str:
    if not holder:
        return "holder unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {since}"
