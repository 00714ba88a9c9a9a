"""A process on this host as /proc/<pid>/stat describes it: its state, parent and start time, read one way.

Why one reader: the file lock judges whether a holder on this host still runs (its pid alive, not a zombie, started
when the lock file says, so a reused pid does not count), the local launcher finds and ends a member's processes,
and the fork server's test checks its children. The command name in /proc/<pid>/stat may hold spaces and
parentheses, so the fields are split after its last ')' here, once for all of them.
"""
from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses): state, ppid,
    ... (starttime is index 19); None where the process or /proc is not there."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), to tell a reused pid apart."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def pid_alive(pid: int | None, proc_start: str | None) -> bool:
    """Whether ``pid`` on this host still runs and is the same process (same start time, not a zombie)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except (OSError, OverflowError):
        return False
    fields = proc_stat(pid)
    if fields:
        if fields[0] in ("Z", "X"):
            return False
        if proc_start is not None and len(fields) > 19 and fields[19] != proc_start:
            return False
    return True
