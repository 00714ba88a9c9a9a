"""How a sandbox worker is started: inside bubblewrap when the machine allows it, else a plain process.

Why separate: the probe and the bwrap command line are the only machine-dependent parts of the
sandbox; keeping them here lets the worker code stay the same in both modes.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: What the fallback mode does NOT give, named in the one-time warning.
NOT_ISOLATED_WITHOUT_BWRAP = (
    "network (no own network namespace)",
    "file system (not read-only outside the work dir)",
    "processes (no own pid namespace; others visible in /proc)",
    "process count (RLIMIT_NPROC is per user: raised by the user's tasks at each run, so it bounds a program's "
    "forks only up to what the user's other processes do meanwhile)",
)
SANDBOX_ROOT = "/tmp/sandbox"  # inside the private /tmp: "/" is read-only, so no new mount points
#: the kernel from which RLIMIT_NPROC counts a user namespace's own tasks (ucounts); before it, every task (thread) of
#: the real user on the node counts, other members' torch threads included
PER_NAMESPACE_NPROC_KERNEL = (5, 14)


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of this node's kernel (``platform.release()``: "4.18.0-513.el8.x86_64" -> (4, 18))."""
    parts = (release or platform.release()).split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def user_tasks(uid: int) -> int:
    """Tasks (threads) of ``uid`` on this node, as RLIMIT_NPROC counts them where it counts the whole user."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                total += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue  # ended meanwhile
    return total


def counts_whole_user(isolated: bool, release: str | None = None) -> bool:
    """Whether RLIMIT_NPROC in the sandbox counts every task of its user on the node: without our own user namespace
    (not isolated) on any kernel, and inside one before Linux 5.14."""
    return not isolated or kernel_version(release) < PER_NAMESPACE_NPROC_KERNEL


def nproc_base(isolated: bool, uid: int, release: str | None = None) -> int:
    """What a program's process limit is raised by so that it bounds the program alone: 0 where the limit counts the
    sandbox's namespace only, else the user's tasks now (read before each program runs, so members and threads that
    came and went since are counted as they are).

    Why: a fixed RLIMIT_NPROC of max_processes, counted over every thread of the user (other members' torch threads,
    their sandbox workers), broke every fork on a node already busy with the user's members: the pre-flight excluded
    healthy nodes and graded programs that fork scored 0. Raised by the current count, a fork bomb is still stopped
    after max_processes tasks."""
    return user_tasks(uid) if counts_whole_user(isolated, release) else 0

_PROBE_SOURCE = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x40000000 | 0x20000000 | 0x08000000) != 0:
    raise SystemExit("nested unshare failed: errno %d" % ctypes.get_errno())
try:
    open("/probe-write", "w")
    raise SystemExit("root file system is writable")
except OSError:
    pass
print("ok")
"""


@dataclass(frozen=True)
class Isolation:
    """Outcome of the probe: whether bwrap isolation works here, and if not, why."""

    available: bool
    reason: str


def drops_privileges() -> bool:
    """Root runs the sandbox as an unprivileged uid: then file permissions and the process limit bite."""
    return os.geteuid() == 0


def bwrap_command(python: str, tmp_mb: int, scratch_mb: int) -> list[str]:
    """bwrap arguments: own namespaces, read-only /, small private /tmp and work area, empty environment."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise FileNotFoundError("bwrap not found on PATH")
    return [
        bwrap,
        "--unshare-user", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", SANDBOX_ROOT, "--setenv", "LANG", "C.UTF-8",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
        "--size", str(scratch_mb << 20), "--perms", "0777", "--tmpfs", SANDBOX_ROOT,
        "--chdir", SANDBOX_ROOT,
        python,
    ]


def run_as_kwargs(uid: int) -> dict:
    """subprocess keyword arguments that drop root to `uid` (no preexec_fn: safe in threaded trainers)."""
    if not drops_privileges():
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


@functools.lru_cache(maxsize=None)
def pick_interpreter(preferred: str, uid: int) -> str:
    """First Python the sandbox user can run: root may own an interpreter nobody else can reach."""
    candidates = [preferred, os.path.realpath(preferred), "/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in dict.fromkeys(candidates):
        try:
            done = subprocess.run([candidate, "-I", "-c", "import ctypes, resource, json, select"],
                                  capture_output=True, timeout=60, env={}, **run_as_kwargs(uid))
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            if candidate != preferred:
                logger.info("sandbox uses %s (uid %d cannot run %s)", candidate, uid, preferred)
            return candidate
    raise FileNotFoundError(f"no Python interpreter runnable by uid {uid} among {candidates}; "
                            f"set sandbox.python to one it can execute")


@functools.lru_cache(maxsize=None)
def probe_isolation(python: str, uid: int) -> Isolation:
    """Try the real thing once: bwrap plus the nested namespaces each program gets, as the sandbox user."""
    if shutil.which("bwrap") is None:
        return Isolation(False, "bubblewrap (bwrap) is not installed")
    cmd = bwrap_command(python, 1, 1) + ["-I", "-c", _PROBE_SOURCE]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={},
                              **run_as_kwargs(uid))
    except (OSError, subprocess.SubprocessError) as exc:
        return Isolation(False, f"bwrap could not start: {exc}")
    if done.returncode != 0 or done.stdout.strip() != "ok":
        detail = (done.stderr.strip() or done.stdout.strip())[-300:]
        return Isolation(False, f"bwrap sandbox did not work here (exit {done.returncode}): {detail}")
    return Isolation(True, "bwrap with user, network, pid and ipc namespaces")
