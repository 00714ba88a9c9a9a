"""Loaded by every Python process of a test that puts this folder first on PYTHONPATH
(tests/scripts/test_node_bundle.py).

Why: a GPU node has only what its image and the node bundle bring, and ray cannot be brought (79 MB). Two things are
checked in every process of the main job there, members and sandbox workers included, not only in the test's own:
- ``import ray`` fails as it would on the node, and probing for it finds nothing (every meta-path finder is wrapped
  so that it does not see the top-level modules MIRROR_ES_BLOCK_IMPORTS names, comma-separated);
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


class _Hiding(importlib.abc.MetaPathFinder):
    """One of the interpreter's finders, blind to the blocked top-level modules: with every finder wrapped, a blocked
    module is absent as on the node (``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` returns
    None), so code that probes for it optionally behaves as it would there."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (the finder protocol)
        if fullname.partition(".")[0] in _BLOCKED:
            return None
        find = getattr(self._inner, "find_spec", None)
        return find(fullname, path, target) if find is not None else None

    def __getattr__(self, name: str) -> object:  # find_distributions, invalidate_caches, ...
        return getattr(self._inner, name)


def _log_import(event: str, args: tuple) -> None:
    if event != "import" or not args:
        return
    top = str(args[0]).partition(".")[0]
    if top in _SEEN or not top or top in _BLOCKED:  # a blocked module is only ever attempted, never imported
        return
    _SEEN.add(top)
    line = json.dumps({"pid": os.getpid(), "argv": list(sys.argv[:3]), "module": top}) + "\n"
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


if _BLOCKED:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
if _LOG:
    sys.addaudithook(_log_import)
