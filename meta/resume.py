"""Resume checks: which config changes are allowed when continuing a run.

Changes to anything that defines the search (population, es, seed, init, the inner config...) would make the
resumed run a different experiment than its first generations, so they are refused with a list of the
differences. Launcher limits, logging, retries, the failure threshold, the wall limit and the number of
generations may change.
"""
from __future__ import annotations

from typing import Any, Mapping

from meta.config import SEARCH_KEYS

IGNORED_KEYS = ("run_dir",)


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Dotted keys whose values differ, with (old, new) values; missing keys show as '<absent>'."""
    diffs: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new), key=str):
        dotted = f"{prefix}{key}"
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            diffs.extend(config_differences(a, b, dotted + "."))
        elif a != b:
            diffs.append((dotted, a, b))
    return diffs


def is_search_key(dotted: str) -> bool:
    return any(dotted == key or dotted.startswith(key + ".") for key in SEARCH_KEYS)


def split_differences(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[list[tuple[str, Any, Any]], list[tuple[str, Any, Any]]]:
    """(refused, allowed) differences between the stored config and the one asked for now."""
    refused, allowed = [], []
    for diff in config_differences(old, new):
        if diff[0] in IGNORED_KEYS:
            continue
        (refused if is_search_key(diff[0]) else allowed).append(diff)
    return refused, allowed


def format_differences(diffs: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} -> {new!r}" for key, old, new in diffs)
