"""Third-party entries of the registries (searchers, divergences, tasks), found through Python entry points.

Why: adding a searcher, a divergence or a task must be one new module and one new YAML, with no file of this
repository edited. A package declares its entry under the group ``mirror_es.<registry>`` (in its pyproject.toml:
``[project.entry-points."mirror_es.searchers"] toy = "toy_pkg.searcher:ToySearcher"``) and each registry adds what
the group holds to its built-in entries (docs/extending.md). Standard library only: every layer may use it.
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

#: the entry-point group of a registry is this prefix plus the registry's name
GROUP_PREFIX = "mirror_es."


def entry_point_objects(registry: str) -> dict[str, Any]:
    """The objects the installed packages declare under ``mirror_es.<registry>``, by entry-point name; ValueError
    naming the entry point when one cannot be loaded (a broken plugin must not look like an unknown name)."""
    group = GROUP_PREFIX + registry
    found: dict[str, Any] = {}
    for point in entry_points(group=group):
        try:
            found[point.name] = point.load()
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party import is reported the same way
            raise ValueError(f"entry point {point.name} = {point.value} (group {group}) cannot be loaded: "
                             f"{type(exc).__name__}: {exc}") from exc
    return found
