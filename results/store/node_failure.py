"""The one reader of a member's PREFLIGHT_FILE: the node that could not run it and why (inner_loop/preflight.py
writes it; the SLURM launcher excludes the node, the runner ends a member no node could run as node_failed)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from results.store.layout import PREFLIGHT_FILE


def read_node_failure(work_dir: str | Path) -> dict[str, Any] | None:
    """{host, cause, ...} of the member's last failed pre-flight; None when its last one passed or the file is
    unreadable (absent, or half-read over a shared filesystem: then a plain failure)."""
    try:
        failure = json.loads((Path(work_dir) / PREFLIGHT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return failure if isinstance(failure, dict) and failure.get("host") and "cause" in failure else None
