"""The one reader of a member's PREFLIGHT_FILE: the node that could not run it and why (inner_loop/member/preflight.py
writes it; the SLURM launcher excludes the node, the runner ends a member no node could run as node_failed)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from results.store.layout import PREFLIGHT_FILE


#: the name slurmd gives its node in every job it runs: what ``sbatch --exclude`` takes
SLURM_NODE_ENV = "SLURMD_NODENAME"


def node_name() -> str:
    """This node's name as the scheduler knows it: SLURM's own (``SLURMD_NODENAME``; else the job's node list when
    it is one plain name), else the host name.

    Why not ``socket.gethostname()`` alone: on many clusters it is a full domain name, or differs from slurm.conf's
    NodeName, and ``sbatch --exclude`` refuses a name it does not know ("Invalid node name specified"), which would
    fail every resubmission of the member."""
    name = os.environ.get(SLURM_NODE_ENV, "").strip()
    if name:
        return name
    nodes = os.environ.get("SLURM_JOB_NODELIST", "").strip()
    if nodes and not any(ch in nodes for ch in ",[]"):
        return nodes
    return socket.gethostname()


def read_node_failure(work_dir: str | Path) -> dict[str, Any] | None:
    """{host, cause, ...} of the member's last failed pre-flight; None when its last one passed or the file is
    unreadable (absent, or half-read over a shared filesystem: then a plain failure)."""
    try:
        failure = json.loads((Path(work_dir) / PREFLIGHT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return failure if isinstance(failure, dict) and failure.get("host") and "cause" in failure else None
