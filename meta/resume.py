"""Resume checks: which config changes are allowed when continuing a run.

Changes to anything that defines the search (population, es, seed, init, the inner config...) would make the
resumed run a different experiment than its first generations, so they are refused with a list of the
differences. Launcher limits, logging, retries, the failure threshold, the wall limit and the number of
generations may change. The launcher kind and the cluster may not: a run's job ids mean something only to the
scheduler that issued them.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from meta.config import ADDED_SEARCH_KEYS, HOUSEKEEPING_KEYS, SEARCH_KEYS, ConfigError

logger = logging.getLogger(__name__)

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


def is_search_key(dotted: str, keys: Sequence[str] = SEARCH_KEYS) -> bool:
    if dotted in HOUSEKEEPING_KEYS:
        return False
    return any(dotted == key or dotted.startswith(key + ".") for key in keys)


def split_differences(
    old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str] = SEARCH_KEYS,
) -> tuple[list[tuple[str, Any, Any]], list[tuple[str, Any, Any]]]:
    """(refused, allowed) differences between the stored config and the one asked for now: a difference under
    ``keys`` (what the run computes: meta.config.SEARCH_KEYS, or meta.tune's STUDY_KEYS) is refused."""
    refused, allowed = [], []
    old = {**ADDED_SEARCH_KEYS, **old}  # a run from before a key existed ran with the value that reproduces it
    for diff in config_differences(old, new):
        if diff[0] in IGNORED_KEYS:
            continue
        (refused if is_search_key(diff[0], keys) else allowed).append(diff)
    return refused, allowed


def format_differences(diffs: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} -> {new!r}" for key, old, new in diffs)


def check_resume(stored: Mapping[str, Any], raw: Mapping[str, Any], keys: Sequence[str], run_dir: str,
                 what: str) -> None:
    """The resume of a ``what`` (search, study, pilot) at ``run_dir``: ConfigError listing the refused changes
    (``keys``: what the run computes); the allowed ones are logged."""
    refused, allowed = split_differences(stored, raw, keys)
    if refused:
        raise ConfigError(
            f"run_dir={run_dir} was started as a different {what}; these changes are refused on resume:\n"
            f"{format_differences(refused)}\nDrop them to resume, or start a new {what} with another run_dir")
    if allowed:
        logger.info("resuming with changed settings:\n%s", format_differences(allowed))


def check_job_namespace(raw: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, str]:
    """The launcher kind and cluster this run's job ids belong to; ConfigError when a resume changes either.

    Job ids in jobs.json mean something only to the scheduler that issued them: a local pid looked up in sacct,
    or a SLURM id on another cluster, is someone else's job. Asks the cluster once (SLURM) before anything is
    written or submitted."""
    from launch.factory import job_namespace

    kind = str(raw["launcher"].get("name"))
    old_kind = manifest.get("launcher")
    if old_kind is not None and old_kind != kind:
        raise ConfigError(
            f"run_dir={raw['run_dir']} was started with launcher={old_kind} and cannot be resumed with "
            f"launcher={kind}: its jobs.json holds {old_kind} job ids. Resume with launcher={old_kind}, or start a "
            "new run_dir"
        )
    try:
        cluster = job_namespace(raw["launcher"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    old_cluster = manifest.get("cluster")
    if old_cluster is not None and old_cluster != cluster:
        where = "SLURM cluster" if kind == "slurm" else "host"
        raise ConfigError(
            f"run_dir={raw['run_dir']} was started on {where} {old_cluster!r} and this is {where} {cluster!r}: its "
            f"{kind} job ids would name other jobs here. Resume it on {old_cluster!r}, or start a new run_dir"
        )
    return {"launcher": kind, "cluster": cluster}
