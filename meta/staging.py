"""Staging and pre-flight as meta.run does them before its first submission (the ``python -m meta.stage`` door is
meta/stage.py).

Staging: the entry point's ``stage`` (inner_loop.staging.stage_inner) finds every hub repository the members read in
the stage cache (fetching what is missing unless this is a dry run); this module points the config's keys at the
staged snapshots, pins them in the manifest under ``staged`` (commit, content hash, bytes per repository) and refuses,
exit status 2 before anything is written, what is missing. Pre-flight: the entry point's ``preflight`` on this host.
The outer loop knows nothing about models: which keys name hub repositories is the entry point's to say.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, MutableMapping

from meta.config import INNER_NODES, ConfigError
from results.store.config_nodes import refuse_unknown_keys

if TYPE_CHECKING:
    from meta.config import SearchConfig

logger = logging.getLogger("meta.stage")

#: the manifest's key for the pins of a staged run
MANIFEST_KEY = "staged"
#: launchers whose members run on the submitting host (its pre-flight can tell whether their sandbox works)
LOCAL_LAUNCHERS = ("local", "debug")
#: the ``stage`` node of conf/config.yaml
STAGE_KEYS = ("cache_dir", "revisions", "model_patterns")


def _set_dotted(raw: MutableMapping[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value


def stage_run(raw: MutableMapping[str, Any], manifest: MutableMapping[str, Any], resuming: bool,
              fetch: bool) -> None:
    """Stage what the members of ``raw`` read from the hub (``fetch``: download what is missing), point the config's
    keys at the staged snapshots and record the pins in ``manifest``; ConfigError (exit 2) naming every item that is
    missing when the run cannot go on without it. A run resumed from before staging existed is left as it was."""
    from launch.member import load_entrypoint

    inner_settings = raw.get("inner") or {}
    try:
        stage = getattr(load_entrypoint(str(inner_settings.get("entrypoint") or "")), "stage", None)
    except ValueError:
        return  # the config check that follows names the bad entry point
    if not callable(stage):
        return  # an objective that reads nothing from the hub (e.g. a synthetic one)
    if resuming and MANIFEST_KEY not in manifest:
        logger.info("staging: this run was started unstaged; its members keep loading by hub name")
        return
    settings = dict(raw.get("stage") or {})
    refuse_unknown_keys(settings, STAGE_KEYS, "stage")
    cache_dir = settings.get("cache_dir")
    pins = (manifest.get(MANIFEST_KEY) or {}).get("items") or []
    inner = {node: raw[node] for node in INNER_NODES if node in raw}
    try:
        items = stage(inner, cache_dir=cache_dir, revisions=settings.get("revisions") or {}, pins=pins, fetch=fetch,
                      model_patterns=settings.get("model_patterns"))
    except (ValueError, KeyError, TypeError):
        return  # a bad inner config: the config check that follows names the key
    offline = False
    for item in items:
        logger.info("staging: %s", item.pop("line"))
        offline = item.pop("offline") or offline
    if not items:
        logger.info("staging: nothing to fetch (the model and the data are built here or are local files)")
    missing = [item for item in items if item["status"] != "staged"]
    # what was found, for meta.stage to print; persisted only with the run's files, which need every item staged
    manifest[MANIFEST_KEY] = {"cache_dir": str(Path(cache_dir).expanduser()) if cache_dir else None, "items": items}
    if missing and (fetch or offline):
        raise ConfigError(f"{len(missing)} of {len(items)} hub item(s) not staged ("
                          + ", ".join(f"{m['kind']} {m['repo_id']}" for m in missing) + "; the lines above say why): "
                          "stage them with `python -m meta.stage <the same overrides>` on a host with network access "
                          "(stage.cache_dir on the filesystem the members share)")
    if missing:
        logger.info("staging: meta.run stages the missing item(s) before its first submission")
        return
    for item in items:
        _set_dotted(raw, item["key"], item["path"])


def preflight_run(cfg: "SearchConfig") -> None:
    """The members' pre-flight on this (the submitting) host before the first submission: the staged files are
    readable, the run directory has room for a checkpoint, and, where members run on this host (launcher local or
    debug), the sandbox works. ConfigError (exit 2) naming the host and the cause; nothing is written."""
    from launch.member import load_entrypoint

    check = getattr(load_entrypoint(cfg.inner_entrypoint), "preflight", None)
    if not callable(check):
        return
    try:
        check(cfg.member_inner(), cfg.run_dir, probe_sandbox=str(cfg.launcher.get("name")) in LOCAL_LAUNCHERS)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
