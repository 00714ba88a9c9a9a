"""Third-party entries of the registries (searchers, divergences, tasks, models, launchers), found through Python
entry points.

Why: adding a searcher, a divergence or a task must be one new module and one new YAML, with no file of this
repository edited. A package declares its entry under the group ``mirror_es.<registry>`` (in its pyproject.toml:
``[project.entry-points."mirror_es.searchers"] toy = "toy_pkg.searcher:ToySearcher"``) and each registry adds what
the group holds to its built-in entries (docs/extending.md). Standard library only: every layer may use it.
"""
from __future__ import annotations

import functools
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

#: the entry-point group of a registry is this prefix plus the registry's name
GROUP_PREFIX = "mirror_es."


def entry_point_objects(registry: str, what: str, name_of: Callable[[Any], str | None]) -> dict[str, Any]:
    """The entries the installed packages declare under ``mirror_es.<registry>``, by entry-point name.

    ``name_of(obj)``: the entry's own name when ``obj`` is an entry of this registry (``what`` says what one is),
    else None. ValueError naming the entry point when it cannot be loaded, is no entry, or carries another name than
    the entry point's (a broken plugin must not look like an unknown name)."""
    group = GROUP_PREFIX + registry
    found: dict[str, Any] = {}
    for point in _declared(group, tuple(sys.path)):
        try:
            entry = point.load()
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party import is reported the same way
            raise ValueError(f"entry point {point.name} = {point.value} (group {group}) cannot be loaded: "
                             f"{type(exc).__name__}: {exc}") from exc
        if name_of(entry) != point.name:
            raise ValueError(f"entry point {point.name} = {point.value} (group {group}) must be {what} named "
                             f"{point.name!r}, got {entry!r}")
        found[point.name] = entry
    return found


@functools.lru_cache(maxsize=None)
def _declared(group: str, search_path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    """The entry points of ``group`` that the packages on ``search_path`` declare. Read once per path: each reading
    scans every installed distribution's metadata (~10 ms), and a plan or a dry run asks the registries ~200 times."""
    return tuple(entry_points(group=group))
