"""The config of a ``meta.*`` command: conf/<name>.yaml composed by Hydra with the command line, as a plain dict.

One place for the run and the tune commands (and the tests that compose presets): Hydra without chdir or output
dirs, its errors as ConfigError naming the key, the group choices Hydra made, and the replay of a run's earlier
overrides under new ones on resume.
"""
from __future__ import annotations

from typing import Any, Sequence

from inner_loop.loss.divergences import fill_default_coef
from meta.search.config import CONF_DIR
from meta.settings.member_time import derive_inner_timeout, derive_member_time, member_sharing
from meta.settings.schema import ConfigError, register
from meta.search.resume import NEW_KEY
from meta.settings.upgrade import refuse_former_names
from core.config.groups import check_group_choice, checked_overrides, config_groups, with_config_path
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


def _hydra_compose(overrides: Sequence[str], config_name: str) -> tuple[dict[str, Any], dict[str, str]]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    register()  # the schemas the defaults lists name (base_config, tune_base_config)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="meta_run"):
            cfg = hydra_compose(config_name=config_name, overrides=with_config_path(overrides),
                                 return_hydra_config=True)
        choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items()
                   if not str(k).startswith("hydra/") and v is not None}
        with open_dict(cfg):
            del cfg["hydra"]
        raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(  # a key or value a schema refuses named, with where it was set
            f"{composition_error(exc)}\n(check the key against conf/{config_name}.yaml; a config group is chosen "
            "with group=name)") from None
    fill_default_coef(raw)  # a divergence's YAML leaves its default coefficient to the registry
    member_sharing(raw)  # resources.members_per_gpu and its slowdowns, whether or not inner.timeout_s is given
    derive_member_time(raw)
    derive_inner_timeout(raw)
    return raw, choices


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
