"""Resume checks: which config changes are allowed when continuing a run.

Changes to anything that defines the search (population, es, seed, init, the inner config...) would make the
resumed run a different experiment than its first generations, so they are refused with a list of the
differences. Launcher limits, logging, retries, the failure threshold, the wall limit and the number of
generations may change. The launcher kind and the cluster may not: a run's job ids mean something only to the
scheduler that issued them.
"""
from __future__ import annotations

import datetime as _dt
import difflib
import logging
import os
from pathlib import Path
from typing import Any, Mapping, MutableMapping, Sequence

from meta.search.config import HOUSEKEEPING_KEYS, SEARCH_KEYS, ConfigError, absolute_path
from meta.settings.upgrade import retired_setting_refusal
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)

#: the key of conf/config.yaml and conf/tune.yaml that says run_dir names a new run; never recorded nor replayed
NEW_KEY = "new"
#: keys of a run's command that say how this invocation runs, not what the run is: never a change on resume
IGNORED_KEYS = ("run_dir", "dry_run", NEW_KEY)
#: the member program's name: a change of the name alone (the same program) is no change of the run
ENTRYPOINT_KEY = "inner.entrypoint"


def open_run_dir(raw: MutableMapping[str, Any], cwd: Path, prefix: str, what: str) -> tuple[str, bool]:
    """(the absolute run_dir, whether it resumes a run) of a command's composed config, with ``new`` taken out of
    ``raw``. A run_dir that does not exist (or a folder that holds something else) starts a new ``what`` only with
    new=true (or with no run_dir at all: ``outputs/<prefix>_<timestamp>``; or an empty folder); otherwise it is refused naming the closest existing run directories, so that a
    mistyped resume path never starts a search. An existing run_dir resumes, new=true or not: the same command line
    run again (a requeued job) goes on with its run."""
    new = raw.pop(NEW_KEY, False)
    if not isinstance(new, bool):
        raise ConfigError(f"{NEW_KEY}={new!r} must be true or false")
    given = raw.get("run_dir")
    run_dir = absolute_path(given or f"outputs/{prefix}_{_dt.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}", cwd)
    exists = RunStore(run_dir).exists()
    empty = os.path.isdir(run_dir) and not os.listdir(run_dir)  # made for this run: a new run is what it is for
    if given and not exists and not new and not empty:
        near = nearest_run_dirs(Path(run_dir))
        named = ("; the closest existing run directories: " + ", ".join(near)) if near else ""
        raise ConfigError(f"run_dir={run_dir} holds no run to resume{named}. To start a new {what} there, add "
                          f"{NEW_KEY}=true")
    return run_dir, exists


def run_dir_label(run_dir: str | Path, resuming: bool, what: str) -> str:
    """What a command does with its run_dir, in the words of its plan and its log: a new run is said so."""
    return f"resume of the {what} in {run_dir}" if resuming else f"new {what} in {run_dir}"


def nearest_run_dirs(missing: Path, n: int = 3) -> list[str]:
    """The run directories (two levels below the nearest existing parent of ``missing``) whose paths read closest
    to it, best first."""
    parent = missing.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    found = {str(p.relative_to(parent)): str(p) for p in [*parent.glob("*"), *parent.glob("*/*")]
             if p.is_dir() and RunStore(p).exists()}
    near = difflib.get_close_matches(str(missing.relative_to(parent)), list(found), n=n, cutoff=0.6)
    return [found[name] for name in near]


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
    ``keys`` (what the run computes: meta.search.config.SEARCH_KEYS, or meta.tune's STUDY_KEYS) is refused.
    ``old`` as this version reads it: a run dir's config through its upgrade (meta/settings/upgrade.py)."""
    refused, allowed = [], []
    for diff in config_differences(old, new):
        if diff[0] in IGNORED_KEYS:
            continue
        moved = diff[0] == ENTRYPOINT_KEY and same_entrypoint(diff[1], diff[2])
        (refused if is_search_key(diff[0], keys) and not moved else allowed).append(diff)
    return refused, allowed


def same_entrypoint(old: Any, new: Any) -> bool:
    """Whether two ``inner.entrypoint`` names load one member program: a name a run started earlier stored (an old
    module path kept as an alias, a function kept as a name of its program) and today's. Such a run resumes."""
    from launch.member import load_program

    try:
        return load_program(old) == load_program(new)
    except ValueError:
        return False


def format_differences(diffs: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} -> {new!r}" for key, old, new in diffs)


def check_resume(stored: Mapping[str, Any], raw: Mapping[str, Any], keys: Sequence[str], run_dir: str,
                 what: str) -> None:
    """The resume of a ``what`` (search, study, pilot) at ``run_dir``: ConfigError listing the refused changes
    (``keys``: what the run computes); the allowed ones are logged. A stored setting that its searcher's algorithm
    retired is refused first, saying when and why (the settings it moved would read as changes the user made)."""
    es = stored.get("es")
    retired = retired_setting_refusal(es) if isinstance(es, Mapping) else None
    if retired:
        raise ConfigError(f"run_dir={run_dir}: {retired}")
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
    from launch.factory import job_namespace, launcher_class

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
        where = launcher_class(raw["launcher"]).namespace_kind
        raise ConfigError(
            f"run_dir={raw['run_dir']} was started on {where} {old_cluster!r} and this is {where} {cluster!r}: its "
            f"{kind} job ids would name other jobs here. Resume it on {old_cluster!r}, or start a new run_dir"
        )
    return {"launcher": kind, "cluster": cluster}
