"""Loaded by every Python process of a test that puts this folder first on PYTHONPATH (tests/test_node_bundle.py).

Why: a GPU node has only what its image and the node bundle bring, and ray cannot be brought (79 MB). Two things are
checked in every process of the main job there, members and sandbox workers included, not only in the test's own:
- ``import ray`` fails as it would on the node (a meta-path finder refuses it; MIRROR_ES_BLOCK_IMPORTS names the
  top-level modules to refuse, comma-separated);
- every top-level module a process imports is appended to MIRROR_ES_IMPORT_LOG (one JSON line: pid, argv, module),
  written at once, so a process that ends with os._exit or a signal has still logged what it imported.
"""
from __future__ import annotations

import importlib.abc
import json
import os
import sys

_BLOCKED = frozenset(filter(None, os.environ.get("MIRROR_ES_BLOCK_IMPORTS", "").split(",")))
_LOG = os.environ.get("MIRROR_ES_IMPORT_LOG")
_SEEN: set[str] = set()


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses the blocked top-level modules, as if they were not installed."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (the finder protocol)
        if fullname.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: MIRROR_ES_BLOCK_IMPORTS)",
                                      name=fullname)
        return None


def _log_import(event: str, args: tuple) -> None:
    if event != "import" or not args:
        return
    top = str(args[0]).partition(".")[0]
    if top in _SEEN or not top:
        return
    _SEEN.add(top)
    line = json.dumps({"pid": os.getpid(), "argv": list(sys.argv[:3]), "module": top}) + "\n"
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


if _BLOCKED:
    sys.meta_path.insert(0, _Refuse())
if _LOG:
    sys.addaudithook(_log_import)
