"""One orchestrator per run directory.

The lock is a ``core.file_lock.FileLock`` on run_dir/LOCK: an flock-backed lock file where the filesystem has
flock (the kernel frees it when the holder dies, even by SIGKILL, so a resume right after a crash is never
blocked), a lock file with the holder's pid and a heartbeat where it has not (Lustre without flock, some NFS),
and in both cases a holder on another host counts as alive while its heartbeat is fresh. The second
orchestrator is refused with the holder's host, pid, start and last heartbeat.
"""
from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Callable

from core.file_lock import DEFAULT_HEARTBEAT_S, FileLock, LockHeld


logger = logging.getLogger(__name__)

#: the exit status of a command refused because another orchestrator holds its run dir
LOCKED_EXIT = 3


class RunLockedError(RuntimeError):
    """Another live orchestrator holds the run directory."""


class RunLock:
    """Non-blocking exclusive lock on a run directory's LOCK file, held for the orchestrator's lifetime."""

    def __init__(
        self, path: str | Path, heartbeat_s: float = DEFAULT_HEARTBEAT_S, stale_after_s: float | None = None
    ) -> None:
        self.path = Path(path)
        self._lock = FileLock(self.path, owner="orchestrator", heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)

    def acquire(self) -> None:
        """Take the lock or raise RunLockedError naming the holder; a stale lock is taken over (logged)."""
        try:
            self._lock.acquire(blocking=False)
        except LockHeld as exc:
            raise RunLockedError(
                f"{self.path.parent} is in use by another orchestrator: its {self.path.name} is {exc.reason}. "
                "Wait for it to finish or stop it before resuming"
            ) from None

    def release(self) -> None:
        self._lock.release()

    def holder_status(self) -> tuple[bool, str] | None:
        """(alive, description) of the orchestrator holding the run, None if none does; read-only."""
        return self._lock.holder_status()

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def run_locked(path: str | Path, body: Callable[[], int]) -> int:
    """``body()`` while holding the run dir's lock (released however it ends); LOCKED_EXIT, logged, when another
    orchestrator holds it. Every command that writes a run dir (run, reevaluate, tune, pilot) goes through here."""
    lock = RunLock(path)
    try:
        lock.acquire()
    except RunLockedError as exc:
        logger.error("%s", exc)
        return LOCKED_EXIT
    try:
        return body()
    finally:
        lock.release()
