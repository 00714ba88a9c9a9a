"""The config of a ``meta.*`` command: conf/<name>.yaml composed by Hydra with the command line, as a plain dict.

One place for the run and the tune commands (and the tests that compose presets): Hydra without chdir or output
dirs, its errors as ConfigError naming the key, the group choices Hydra made, and the replay of a run's earlier
overrides under new ones on resume.
"""
from __future__ import annotations

from typing import Any, Sequence

from meta.config import CONF_DIR, ConfigError, derive_inner_timeout, derive_member_time


def compose(overrides: Sequence[str], config_name: str = "config") -> dict[str, Any]:
    """Compose conf/<config_name>.yaml (config: meta.run, tune: meta.tune) with ``overrides`` into a resolved plain
    dict, with inner.timeout_s derived from the preset's time per member when null; ConfigError for bad overrides."""
    return compose_with_choices(overrides, config_name)[0]


def compose_with_choices(overrides: Sequence[str], config_name: str = "config") -> tuple[dict[str, Any], dict[str, str]]:
    """``compose``, plus the option Hydra chose in each config group (``{"divergence": "kl", ...}``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="meta_run"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items()
                   if not str(k).startswith("hydra/") and v is not None}
        with open_dict(cfg):
            del cfg["hydra"]
        raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{message}\n(check the key against conf/{config_name}.yaml; a new key needs a leading '+', "
            "a config group is chosen with group=name)"
        ) from None
    derive_member_time(raw)
    derive_inner_timeout(raw)
    return raw, choices


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """Old overrides with those re-set in ``new`` replaced (later wins), run_dir dropped."""
    merged: dict[str, str] = {}
    for override in [*old, *new]:
        key = _override_key(override)
        if key == "run_dir":
            continue
        merged.pop(key, None)
        merged[key] = override
    return list(merged.values())
