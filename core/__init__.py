"""The ground floor every room stands on: the member/result records (the contract between meta, the launchers and
the inner loop), config nodes, the registries' entry-point reader, the cross-host file lock, process stats, GPU-time
arithmetic, the notice window, the shared key names and the staging pins. It imports nothing of the project's.

Modules that moved here keep their old dotted paths (``alias_moved``), because the pickled jobs and results of a
search started before the move name them.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Mapping


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module at its new one (the same module object, not a copy)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (importlib's protocol)
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: D102
        module = importlib.import_module(self.moved[spec.name])
        self._own_spec = module.__spec__  # importlib sets __spec__ to the alias's next: put the module's own back
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module) -> None:  # noqa: D102 (already executed under its new name)
        module.__spec__ = self._own_spec


def alias_moved(moved: Mapping[str, str]) -> None:
    """Let each old dotted path in ``moved`` import as the module at its new path (installed once per table)."""
    for finder in sys.meta_path:
        if isinstance(finder, _MovedModuleFinder) and finder.moved == dict(moved):
            return
    sys.meta_path.append(_MovedModuleFinder(moved))
