"""The config of a ``meta.*`` command: conf/<name>.yaml composed by Hydra with the command line, as a plain dict.

One place for the run and the tune commands (and the tests that compose presets): Hydra without chdir or output
dirs, its errors as ConfigError naming the key, the group choices Hydra made, and the replay of a run's earlier
overrides under new ones on resume.
"""
from __future__ import annotations

import copy
import re
from typing import Any, Sequence

from inner_loop.loss.divergences import fill_default_coef
from meta.search.config import CONF_DIR
from meta.settings.member_time import derive_inner_timeout, derive_member_time, member_sharing
from meta.settings.schema import ConfigError, register
from meta.search.resume import NEW_KEY
from meta.settings.upgrade import refuse_former_names
from core.config.groups import (check_group_choice, checked_overrides, config_groups, config_roots,
                                with_config_path)
from core.config.typed_nodes import composition_error


def compose(overrides: Sequence[str], config_name: str = "config") -> dict[str, Any]:
    """Compose conf/<config_name>.yaml (config: meta.run, tune: meta.tune) with ``overrides`` into a resolved plain
    dict, with inner.timeout_s derived from the preset's time per member when null; ConfigError for bad overrides."""
    return compose_with_choices(overrides, config_name)[0]


def compose_with_choices(overrides: Sequence[str], config_name: str = "config") -> tuple[dict[str, Any], dict[str, str]]:
    """``compose``, plus the option Hydra chose in each config group (``{"divergence": "kl", ...}``).

    Every key is checked first (core/config/groups.py): a ``+`` that would quietly add a misspelled key, a
    plain key Hydra cannot find, or a group option that does not exist is a ConfigError naming the closest known
    keys or the group's choices. The check composes the groups alone, so it runs only where it is needed: when an
    override adds (``+``) or deletes (``~``), or when Hydra refused the command line."""
    overrides = list(overrides)
    groups = config_groups(CONF_DIR, overrides)
    checked = False
    try:
        refuse_former_names(overrides)  # a run's stored overrides come upgraded (meta/settings/upgrade.py)
        for override in overrides:
            check_group_choice(override, groups, config_name)
        if any(o.lstrip().startswith(("+", "~")) for o in overrides):
            overrides, checked = _checked(overrides, groups, config_name), True
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return _hydra_compose(overrides, config_name)
    except ConfigError:
        if checked:
            raise
        try:
            normalised = _checked(overrides, groups, config_name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if normalised == overrides:
            raise
        return _hydra_compose(normalised, config_name)


def _checked(overrides: list[str], groups: dict[str, list[str]], config_name: str) -> list[str]:
    picked = [o for o in overrides if o.partition("=")[0].lstrip("+~").split("@", 1)[0] in groups
              or o.lstrip("+").startswith("hydra.")]  # the groups, and where Hydra finds them
    tree, _ = _hydra_compose(picked, config_name)
    return checked_overrides(overrides, tree, groups, config_name)


#: this process's compositions by what decides them (``_composition_key``): Hydra takes ~0.2 CPU-s to compose, a
#: search's start composed the same config several times and a test process hundreds (measured: 246 compositions
#: of 142 configs, 57 of the 84 CPU-s of tests/test_meta/settings and the plan's tests)
_COMPOSED: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, str]]] = {}
_COMPOSED_KEPT = 64
#: a call of a resolver that reads more than the config (``${oc.env:HOME}``, ``${now:%H}``, an extension's own): its
#: composition is not kept; OmegaConf's that read the config alone (``${oc.select:coef_by_divergence.kl,0.04}``) are
_RESOLVER_CALL = re.compile(r"\$\{(?!oc\.(?:select|decode|create|deprecated|dict\.keys|dict\.values):)[\w.]+:")


def _composition_key(overrides: Sequence[str], config_name: str) -> tuple[Any, ...]:
    """What a composition depends on: the command line (with the MIRROR_ES_CONFIG_PATH folders), every YAML of the
    config trees it reads (path, modification time, size) and the schemas registered in this process."""
    from hydra.core.config_store import ConfigStore

    def registered(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, int]]:
        # (Hydra's own group, hydra/, gains its launcher and sweeper in the first composition: not ours to track)
        return [entry for name, node in sorted(tree.items()) if prefix or name != "hydra" for entry in
                (registered(node, f"{prefix}{name}/") if isinstance(node, dict) else [(prefix + name, id(node))])]

    files = [(str(path), stat.st_mtime_ns, stat.st_size) for root in config_roots(CONF_DIR, overrides)
             for path in sorted(root.rglob("*.yaml")) for stat in [path.stat()]]
    return (config_name, tuple(with_config_path(overrides)), tuple(files), tuple(registered(ConfigStore.instance().repo)))


def _hydra_compose(overrides: Sequence[str], config_name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Hydra's composition as a plain dict and the group choices; the same composition again in this process is a
    copy of the first (``_COMPOSED``), unless a value calls a resolver (the environment, the clock)."""
    register()  # the schemas the defaults lists name (base_config, tune_base_config)
    key = _composition_key(overrides, config_name)
    if key not in _COMPOSED:
        raw, choices, repeatable = _compose_anew(overrides, config_name)
        if not repeatable:
            return raw, choices
        if len(_COMPOSED) >= _COMPOSED_KEPT:
            _COMPOSED.pop(next(iter(_COMPOSED)))
        _COMPOSED[key] = (raw, choices)
    raw, choices = _COMPOSED[key]
    return copy.deepcopy(raw), dict(choices)


def _compose_anew(overrides: Sequence[str], config_name: str) -> tuple[dict[str, Any], dict[str, str], bool]:
    """``_hydra_compose`` by Hydra itself, and whether composing again would give the same (no resolver call)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="meta_run"):
            cfg = hydra_compose(config_name=config_name, overrides=with_config_path(overrides),
                                 return_hydra_config=True)
        choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items()
                   if not str(k).startswith("hydra/") and v is not None}
        with open_dict(cfg):
            del cfg["hydra"]
        repeatable = _RESOLVER_CALL.search(repr(OmegaConf.to_container(cfg, resolve=False))) is None
        raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(  # a key or value a schema refuses named, with where it was set
            f"{composition_error(exc)}\n(check the key against conf/{config_name}.yaml; a config group is chosen "
            "with group=name)") from None
    fill_default_coef(raw)  # a divergence's YAML leaves its default coefficient to the registry
    member_sharing(raw)  # resources.members_per_gpu and its slowdowns, whether or not inner.timeout_s is given
    derive_member_time(raw)
    derive_inner_timeout(raw)
    return raw, choices, repeatable


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """Old overrides with those re-set in ``new`` replaced (later wins), run_dir and new (meta/search/resume.py)
    dropped. ``old``: a run's stored command line as its upgrade reads it (meta/settings/upgrade.py
    stored_manifest), under today's key names."""
    merged: dict[str, str] = {}
    for override in [*old, *new]:
        key = _override_key(override)
        if key in ("run_dir", NEW_KEY):  # where and whether new: this invocation's, never replayed
            continue
        merged.pop(key, None)
        merged[key] = override
    return list(merged.values())
