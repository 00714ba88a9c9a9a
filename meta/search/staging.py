"""Staging and pre-flight as meta.run, meta.pilot and meta.tune do them before their first submission (the
``python -m meta.stage`` door is meta/stage.py).

Staging: the member program's ``stage`` (the inner loop's: inner_loop.member.staging.stage_inner) finds every hub
repository the members read in the stage cache (fetching what is missing unless this is a dry run): the model, the
task's dataset and the datasets of the transfer tasks the reporting runs score; this module points the config's keys
at the staged snapshots, pins them in the manifest under ``staged`` (commit, content hash, bytes per repository) and
refuses, exit status 2 before anything is written, what is missing. A config composed later (a reporting row's
transfer task, a tuning trial) reads the pinned snapshots through ``staged_inner``. Pre-flight: the program's
``preflight`` on this host.
The outer loop knows nothing about models: which keys name hub repositories is the program's to say.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, MutableMapping, Sequence

from meta.search.config import INNER_NODES, ConfigError
from core.config.plain_data import refuse_unknown_keys
from core.member_program import MemberProgram
from core.stage_pins import LOCAL, MANIFEST_KEY, STAGED

if TYPE_CHECKING:
    from meta.settings.schema import SearchSchema

logger = logging.getLogger("meta.stage")

#: the ``stage`` node of the config (meta/settings/schema.py Stage)
STAGE_KEYS = ("cache_dir", "revisions", "model_patterns")
#: how a missing item is staged from a host with network, for meta.run and meta.pilot (meta.tune says its own)
STAGE_HINT = "`python -m meta.stage <the same overrides>`"


def _program(entrypoint: Any) -> MemberProgram | None:
    """The member program ``inner.entrypoint`` names, None when it names none (the config check that follows says
    why)."""
    from launch.member import load_program

    try:
        return load_program(str(entrypoint or ""))
    except ValueError:
        return None


def staged_inner(entrypoint: str, inner: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``inner`` reading every repository the run's manifest pins from its staged snapshot: for configs composed
    after staging (a reporting row's transfer tasks, a tuning trial's overrides). Unchanged for an unstaged run."""
    pins = (manifest.get(MANIFEST_KEY) or {}).get("items")
    program = _program(entrypoint)
    return program.use_staged(inner, pins) if pins and program is not None else dict(inner)


def stage_run(raw: MutableMapping[str, Any], manifest: MutableMapping[str, Any], resuming: bool,
              fetch: bool, extra_evaluations: Sequence[Mapping[str, Any]] = (), hint: str = STAGE_HINT) -> None:
    """Stage what the members of ``raw`` read from the hub (``fetch``: download what is missing), point the config's
    keys at the staged snapshots and record the pins in ``manifest``; ConfigError (exit 2) naming every item that is
    missing when the run cannot go on without it. A run resumed from before staging existed is left as it was.
    ``extra_evaluations``: what its reporting runs score besides (transfer tasks), staged and pinned with it.
    ``hint``: the command that stages them on a host with network, for the refusal."""
    program = _program((raw.get("inner") or {}).get("entrypoint"))
    if program is None:
        return
    if resuming and MANIFEST_KEY not in manifest:
        logger.info("staging: this run was started with nothing staged; its members read what their config names")
        return
    settings = dict(raw.get("stage") or {})
    refuse_unknown_keys(settings, STAGE_KEYS, "stage")
    cache_dir = settings.get("cache_dir")
    pins = (manifest.get(MANIFEST_KEY) or {}).get("items") or []
    inner = {node: raw[node] for node in INNER_NODES if node in raw}
    if extra_evaluations:
        inner["extra_evaluations"] = [dict(extra) for extra in extra_evaluations]
    try:
        items = program.stage(inner, cache_dir=cache_dir, revisions=settings.get("revisions") or {}, pins=pins,
                              fetch=fetch, model_patterns=settings.get("model_patterns"))
    except (ValueError, KeyError, TypeError):
        return  # a bad inner config: the config check that follows names the key
    if items is None:
        return  # a program that reads nothing from the hub (e.g. a synthetic objective)
    offline = False
    for item in items:
        logger.info("staging: %s", item.pop("line"))
        offline = item.pop("offline") or offline
    if not items:
        logger.info("staging: nothing to fetch (the model and the data are built here or are local files)")
    hub_items = [item for item in items if item["status"] != LOCAL]
    missing = [item for item in hub_items if item["status"] != STAGED]
    # what was found, for meta.stage to print; persisted only with the run's files, which need every item staged
    manifest[MANIFEST_KEY] = {"cache_dir": str(Path(cache_dir).expanduser()) if cache_dir else None, "items": items}
    if missing and (fetch or offline):
        raise ConfigError(f"{len(missing)} of {len(hub_items)} hub item(s) not staged ("
                          + ", ".join(f"{m['kind']} {m['repo_id']}" + (f" ({m['used_by']})" if m.get("used_by") else "")
                                      for m in missing) + "; the lines above say why): "
                          f"stage them with {hint} on a host with network access "
                          "(stage.cache_dir on the filesystem the members share)")
    if missing:
        logger.info("staging: the run stages the missing item(s) before its first submission")
        return
    staged = program.use_staged({node: raw[node] for node in INNER_NODES if node in raw}, items)
    raw.update({node: staged[node] for node in INNER_NODES if node in raw})


def preflight_run(cfg: "SearchSchema", manifest: Mapping[str, Any],
                  extra_evaluations: Sequence[Mapping[str, Any]] = ()) -> None:
    """The members' pre-flight on this (the submitting) host before the first submission: the staged files are
    readable (the transfer tasks' ``extra_evaluations`` too, read from the manifest's pins as the reporting runs will
    read them), the run directory has room for a checkpoint, and, where members run on this host (the launcher class
    declares ``runs_here``), the sandbox works. ConfigError (exit 2) naming the host and the cause; nothing is
    written."""
    from launch.factory import launcher_class
    from launch.member import load_program

    inner = cfg.member_inner()
    if extra_evaluations:
        inner = staged_inner(cfg.inner.entrypoint, {**inner, "extra_evaluations": [dict(e) for e in extra_evaluations]},
                             manifest)
    try:
        load_program(cfg.inner.entrypoint).preflight(inner, cfg.run_dir or "",
                                                     probe_sandbox=launcher_class(cfg.launcher_node).runs_here)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
