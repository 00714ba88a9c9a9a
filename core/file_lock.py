"""An exclusive lock on a path that works on any shared filesystem: with or without flock, across hosts.

Why not just flock: Lustre mounted without flock makes ``flock()`` fail with ENOSYS, some NFS setups with
ENOLCK / EOPNOTSUPP, and where NFS flock does work it is per host with some servers. So the lock is a file
created with O_EXCL (atomic on local filesystems, NFSv3+ and Lustre): whoever creates ``path`` holds the lock.
The file names its holder (host, pid, process start time, token) and carries a heartbeat timestamp that a
daemon thread refreshes every ``heartbeat_s``, so a waiter can tell a live holder from a dead one:

- Holder on this host: where flock works, the holder also keeps an flock on the file, and the flock is the
  authority (the kernel drops it when the holder dies, even by SIGKILL, and it is immune to pid reuse): a
  free flock means a dead holder. Where flock does not work, the holder is dead once its pid is gone (or the
  pid now belongs to a process that started at another time).
- Holder on another host: alive while its flock is seen held (NFS servers that lock across hosts) or its
  heartbeat is younger than ``stale_after_s``; stale after that.

A stale lock is taken over without races: the contender first creates ``<name>.break-<id>`` with O_EXCL,
where ``<id>`` identifies the stale file it saw (the holder's token); only the creator of that marker may
delete the lock file, and only after re-reading it and finding the same holder. Losers go back to waiting
and then race for the freed path with O_EXCL like any acquirer. Release deletes the file only if it is still
ours (same inode and token), so a holder whose lock was taken over never deletes its successor's.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from core.proc_stat import pid_alive, process_start


logger = logging.getLogger(__name__)

#: How often a holder rewrites its heartbeat.
DEFAULT_HEARTBEAT_S = 30.0
#: Added to 4 heartbeats before a holder on another host counts as gone (see ``FileLock``).
CLOCK_SKEW_MARGIN_S = 60.0
#: flock errors that mean "this filesystem has no flock" (ENOTSUP is EOPNOTSUPP on Linux).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})
#: An EMPTY lock file older than this, whose flock is free, has no holder (see ``FileLock._judge``).
EMPTY_FILE_GRACE_S = 10.0
#: How long a non-blocking acquire keeps retrying while the lock is changing hands (freed, being taken over).
SETTLE_S = 2.0
MIN_POLL_S = 0.02
MAX_POLL_S = 5.0

# (st_dev, errno) pairs already reported, so the fallback is logged once per filesystem and process.
_REPORTED_NO_FLOCK: set[tuple[int, int]] = set()


class LockHeld(RuntimeError):
    """The lock is held by a live holder (non-blocking acquire) or was not freed within ``timeout_s``."""

    def __init__(self, path: Path, holder: "Holder | None", reason: str) -> None:
        self.path = path
        self.holder = holder
        self.reason = reason
        super().__init__(f"{path} is held: {reason}")


@dataclass(frozen=True)
class Holder:
    """What a lock file says about its holder; fields are None where the file did not say."""

    host: str | None = None
    pid: int | None = None
    proc_start: str | None = None
    since: float | None = None
    heartbeat: float | None = None
    token: str | None = None
    flock: bool = False

    @classmethod
    def parse(cls, data: bytes) -> "Holder | None":
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(raw, dict):
            return None

        def number(key: str) -> float | None:
            value = raw.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        pid = raw.get("pid")
        return cls(
            host=str(raw["host"]) if raw.get("host") else None,
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
            proc_start=str(raw["proc_start"]) if raw.get("proc_start") else None,
            since=number("since"),
            heartbeat=number("heartbeat"),
            token=str(raw["token"]) if raw.get("token") else None,
            flock=raw.get("flock") is True,
        )

    def describe(self, now: float | None = None) -> str:
        """'pid 12 on node7, since 2026-11-23 18:00:01, last heartbeat 4 s ago' (for error messages)."""
        now = time.time() if now is None else now
        parts = [f"pid {self.pid if self.pid is not None else '?'} on {self.host or 'an unknown host'}"]
        if self.since is not None:
            parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)))
        if self.heartbeat is not None:
            parts.append(f"last heartbeat {max(0.0, now - self.heartbeat):.0f} s ago")
        return ", ".join(parts)


@dataclass(frozen=True)
class _Seen:
    """One look at an existing lock file: who holds it, whether they are alive, and the file's identity."""

    holder: Holder | None
    alive: bool
    reason: str
    identity: str


class FileLock:
    """Exclusive lock on ``path`` (see the module docstring for the protocol).

    ``stale_after_s`` (default 4 x ``heartbeat_s`` + 60 s) is how old the heartbeat of a holder on another host
    may be before it counts as dead. Four intervals, because a live holder's write can be late by one or two
    (a busy NFS server, a paused VM, a long GC) and declaring a live holder dead lets two processes in; the 60 s
    because the age is the waiter's clock minus the holder's clock, and clocks of two nodes can differ (NTP
    keeps them within milliseconds when it works; a node without it drifts by seconds to minutes). Too long
    only delays the takeover after a crash on another host; too short risks two holders.

    ``owner`` names the kind of holder in messages ("orchestrator", "member job").
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        owner: str = "process",
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        stale_after_s: float | None = None,
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s}")
        self.path = Path(path)
        self.owner = owner
        self.heartbeat_s = float(heartbeat_s)
        default_stale = 4 * self.heartbeat_s + CLOCK_SKEW_MARGIN_S
        self.stale_after_s = float(stale_after_s) if stale_after_s is not None else default_stale
        if self.stale_after_s <= self.heartbeat_s:
            raise ValueError(f"stale_after_s ({self.stale_after_s}) must exceed heartbeat_s ({self.heartbeat_s})")
        self._fd: int | None = None
        self._token: str | None = None
        self._payload: dict | None = None
        self._uses_flock = False
        self._owner_pid: int | None = None
        self._io = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder_status(self) -> tuple[bool, str] | None:
        """(alive, description) of whoever holds the lock file now; None when there is no lock file. Looks only
        (status tools): it never takes, breaks or writes the lock."""
        seen = self._inspect()
        return None if seen is None else (seen.alive, seen.reason)

    def acquire(self, blocking: bool = True, timeout_s: float | None = None) -> None:
        """Take the lock. Blocking: poll with backoff (up to 5 s between looks) while a live holder has it,
        for at most ``timeout_s`` if given. Non-blocking: raise LockHeld at once if a live holder has it."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this FileLock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        poll = MIN_POLL_S
        waiting_logged = False
        settle_until = start + SETTLE_S
        while True:
            if self._create():
                return
            seen = self._inspect()
            if seen is None:  # freed between our create and our look: try again at once
                continue
            if not seen.alive:
                if self._break(seen):
                    continue
                # Someone else is taking it over: wait a moment and look again.
                verdict = f"another process is taking over a stale lock ({seen.reason})"
            else:
                verdict = seen.reason
                settle_until = 0.0
            now = time.monotonic()
            if not blocking and now >= settle_until:
                raise LockHeld(self.path, seen.holder, verdict)
            if timeout_s is not None and now - start >= timeout_s:
                raise LockHeld(self.path, seen.holder, f"{verdict}; gave up after {timeout_s:g} s")
            if blocking and seen.alive and not waiting_logged:
                logger.info("waiting for %s: %s", self.path, verdict)
                waiting_logged = True
            time.sleep(poll)
            poll = min(poll * 1.5, MAX_POLL_S, self.heartbeat_s)

    def release(self) -> None:
        """Give the lock back; deletes the file only if it is still ours. A no-op if not held."""
        if self._fd is None:
            return
        self._stop.set()
        with self._io:
            fd, self._fd = self._fd, None
            try:
                if self._owner_pid != os.getpid():
                    return  # a forked child: the lock and its flock belong to the parent
                try:
                    ours = self._is_ours(fd)
                except OSError as exc:  # e.g. ESTALE on NFS: leave the file; a successor judges it by its holder
                    logger.warning("could not check %s before releasing it (%s); leaving it in place", self.path, exc)
                    ours = False
                else:
                    if not ours:
                        logger.warning("%s is no longer ours (taken over as stale); leaving it in place", self.path)
                if ours:
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                if self._uses_flock:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    except OSError:
                        pass
            finally:
                os.close(fd)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._thread = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    # -- taking the lock ---------------------------------------------------------------------------------

    def _create(self) -> bool:
        """Try to create the lock file; True if we now hold the lock."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            # flock before the holder info is written: a file that says "flock": true is always flocked while
            # its holder lives, so a waiter on this host may trust a free flock to mean a dead holder.
            self._uses_flock = self._try_flock(fd)
            now = time.time()
            self._token = uuid.uuid4().hex
            pid = os.getpid()
            self._payload = {
                "host": socket.gethostname(), "pid": pid, "proc_start": process_start(pid), "since": now,
                "heartbeat": now, "token": self._token, "flock": self._uses_flock, "owner": self.owner,
            }
            self._write(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            raise
        self._fd = fd
        self._owner_pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(self._stop,), name=f"lock-heartbeat:{self.path.name}",
                                        daemon=True)
        self._thread.start()
        return True

    def _try_flock(self, fd: int) -> bool:
        """flock ``fd`` exclusively (waiting): True if taken, False if this filesystem has no flock (logged once
        per filesystem)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in NO_FLOCK_ERRNOS:
                raise
            key = (os.fstat(fd).st_dev, exc.errno)
            if key not in _REPORTED_NO_FLOCK:
                _REPORTED_NO_FLOCK.add(key)
                logger.warning(
                    "flock is not available for %s (%s: %s); using the lock file alone: a holder on this host "
                    "counts as alive while its pid runs, one on another host while its heartbeat (every %g s) "
                    "is younger than %g s",
                    self.path.parent, errno.errorcode.get(exc.errno, exc.errno), exc.strerror,
                    self.heartbeat_s, self.stale_after_s,
                )
            return False
        return True

    def _write(self, fd: int) -> None:
        """Rewrite the holder info in place. Padded with spaces (valid JSON) to at least the current size, so a
        rewrite never shrinks the file and a reader never sees the tail of a longer older version."""
        assert self._payload is not None
        data = json.dumps(self._payload, sort_keys=True).encode("utf-8")
        data = data.ljust(os.fstat(fd).st_size, b" ")
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def _beat(self, stop: threading.Event) -> None:
        """Refresh the heartbeat until released; warn once if the file stops being ours."""
        warned = False
        while not stop.wait(self.heartbeat_s):
            with self._io:
                fd = self._fd
                if fd is None or self._payload is None:
                    return
                try:
                    self._payload["heartbeat"] = time.time()
                    self._write(fd)
                    ours = self._is_ours(fd)
                except OSError as exc:
                    if not warned:
                        logger.warning("could not refresh the heartbeat of %s: %s", self.path, exc)
                        warned = True
                    continue
            if not ours and not warned:
                logger.error("%s was taken over by another process while this one held it", self.path)
                warned = True

    def _is_ours(self, fd: int) -> bool:
        seen = _read(self.path)
        if seen is None:
            return False
        st, data = seen
        mine = os.fstat(fd)
        holder = Holder.parse(data)
        same_file = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
        return same_file and holder is not None and holder.token == self._token

    # -- judging someone else's lock ---------------------------------------------------------------------

    def _inspect(self) -> _Seen | None:
        """Look at the existing lock file; None if it vanished meanwhile."""
        try:
            # Read-write where allowed: NFS implements flock with POSIX locks, whose exclusive kind needs it.
            fd = os.open(self.path, os.O_RDWR)
        except PermissionError:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
        except FileNotFoundError:
            return None
        try:
            st, data = os.fstat(fd), _read_fd(fd)
            holder = Holder.parse(data)
            if holder is None and data:
                # Possibly a heartbeat rewrite caught half-way: look once more.
                time.sleep(0.05)
                st, data = os.fstat(fd), _read_fd(fd)
                holder = Holder.parse(data)
            identity = _identity(holder, st)
            alive, reason = self._judge(holder, st, fd)
            return _Seen(holder, alive, reason, identity)
        finally:
            os.close(fd)  # also drops a probing flock

    def _judge(self, holder: Holder | None, st: os.stat_result, fd: int) -> tuple[bool, str]:
        """(alive, reason). Alive reasons read "held by ...", stale ones "from a dead ..." (see ``FileLock``)."""
        now = time.time()
        if holder is None:
            age = now - st.st_mtime
            if st.st_size == 0 and age > EMPTY_FILE_GRACE_S and _probe_flock(fd):
                # Earlier versions of this project left an empty LOCK behind on release (and in every model
                # cache). A creator writes its holder info within microseconds of creating the file, under its
                # flock; an empty file that old whose flock is free has no holder.
                return False, f"in an empty lock file last modified {age:.0f} s ago, not flocked by anyone"
            what = f"in an unreadable lock file last modified {max(0.0, age):.0f} s ago"
            if age < self.stale_after_s:
                return True, (f"held by an unknown {self.owner} ({what}; it counts as alive for "
                              f"{self.stale_after_s:g} s)")
            return False, f"{what} (stale after {self.stale_after_s:g} s)"
        local = holder.host == socket.gethostname()
        if holder.flock:
            free = _probe_flock(fd)
            if free is False:
                return True, f"held by another {self.owner} ({holder.describe(now)})"
            if free and local:
                return False, f"from a dead {self.owner} ({holder.describe(now)}; its flock is free)"
        if local:
            if pid_alive(holder.pid, holder.proc_start):
                return True, f"held by another {self.owner} ({holder.describe(now)})"
            return False, f"from a dead {self.owner} ({holder.describe(now)}; that pid no longer runs)"
        beat = next((t for t in (holder.heartbeat, holder.since) if t is not None), st.st_mtime)
        age = now - beat
        if age < self.stale_after_s:
            return True, (f"held by another {self.owner} on another host ({holder.describe(now)}); it counts as alive "
                          f"while its heartbeat is younger than {self.stale_after_s:g} s, so if it is gone the lock "
                          f"frees in {self.stale_after_s - age:.0f} s")
        return False, (f"from a dead {self.owner} ({holder.describe(now)}; no heartbeat from that host for "
                       f"{age:.0f} s, stale after {self.stale_after_s:g} s)")

    def _break(self, seen: _Seen) -> bool:
        """Delete a stale lock file if we win the right to; True if it was deleted (then try to create)."""
        digest = hashlib.sha256(seen.identity.encode()).hexdigest()[:16]
        marker = self.path.with_name(f".{self.path.name}.break-{digest}")
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            try:
                age = time.time() - marker.stat().st_mtime
            except FileNotFoundError:
                return False
            if age > self.stale_after_s:
                # A takeover takes milliseconds; a marker this old was left by a contender that died mid-way.
                logger.warning("removing %s, left %.0f s ago by a process that died while taking over", marker, age)
                try:
                    os.unlink(marker)
                except FileNotFoundError:
                    pass
            return False
        try:
            now_seen = _read(self.path)
            if now_seen is None or _identity(Holder.parse(now_seen[1]), now_seen[0]) != seen.identity:
                return False  # released or already taken over by someone else meanwhile
            logger.warning("found a stale lock %s at %s; taking over", seen.reason, self.path)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                return False
            return True
        finally:
            try:
                os.unlink(marker)
            except FileNotFoundError:
                pass


def _identity(holder: Holder | None, st: os.stat_result) -> str:
    """What distinguishes one lock file from the next at the same path: the holder's random token, else (an
    unreadable or foreign file) inode, size and modification time."""
    if holder is not None and holder.token:
        return f"token:{holder.token}"
    return f"file:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _probe_flock(fd: int) -> bool | None:
    """Try the holder's flock without waiting: True if free (then dropped again when ``fd`` closes), False if
    someone holds it, None where flock cannot tell (not available here, or the file is open read-only on NFS)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in NO_FLOCK_ERRNOS or exc.errno == errno.EBADF:
            return None
        raise
    return True


def _read(path: Path) -> tuple[os.stat_result, bytes] | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd), _read_fd(fd)
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)
