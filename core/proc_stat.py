"""/proc/<pid>/stat, read one way for the lock holder checks and the local launcher's process handling."""
from __future__ import annotations

from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses): state, ppid,
    ... (starttime is index 19); None where the process or /proc is not there."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()
