"""Build a launcher from its config node (conf/launcher/<name>.yaml), and the launcher group's schemas.

The node names its class in ``cls`` ("module:Class"), so a new backend is a module plus a YAML file; the
orchestrator never changes. Every other key is passed to the class as an option. The registered launchers (the
built-in ones and those installed packages declare under ``mirror_es.launchers``) put their settings class in Hydra's
ConfigStore as ``launcher/<name>_schema``, with ``name`` and ``cls`` set, which their YAML names first.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from launch.base import (DEFAULT_KILL_GRACE_S, DEFAULT_MAX_LOST_RESUBMITS, Launcher, LauncherPlan, LauncherSettings,
                         PlanContext)
from launch.member import resolve_target
from launch.runner import RunnerPolicy

RESERVED_KEYS = ("name", "cls")


def launcher_class(cfg: Mapping[str, Any]) -> type[Launcher]:
    """Resolve ``cfg['cls']``; ValueError naming the key and the fix otherwise."""
    target = cfg.get("cls")
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(
            f"launcher.cls must be 'module:Class' (got {target!r}); pick a launcher with launcher=<name> (its YAML "
            "names its class: conf/launcher/)"
        )
    try:
        cls = resolve_target(target, "launcher.cls")
    except ValueError as exc:
        raise ValueError(f"{exc}: it cannot be imported") from exc
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        raise ValueError(f"launcher.cls {target!r} is not a launch.base.Launcher subclass")
    return cls


def launchers() -> dict[str, type[Launcher]]:
    """Every registered launcher, by its name: the built-in ones, then those installed packages declare under the
    ``mirror_es.launchers`` entry-point group (a Launcher subclass whose ``name`` is the entry point's). A launcher
    whose keys are the shared ones needs no entry: its YAML names its class (docs/extending.md)."""
    from core.entry_points import entry_point_objects
    from launch.local.launchers import DebugLauncher, LocalLauncher
    from launch.slurm.launcher import SlurmLauncher

    classes: list[type[Launcher]] = [LocalLauncher, DebugLauncher, SlurmLauncher]
    classes += entry_point_objects(
        "launchers", "a launch.base.Launcher subclass",
        lambda c: c.name if isinstance(c, type) and issubclass(c, Launcher) else None).values()
    return {cls.name: cls for cls in classes}


def settings_class(cfg: Mapping[str, Any]) -> type[LauncherSettings]:
    """The dataclass of the launcher node ``cfg`` (its class's ``settings_class``); ValueError naming the key when
    ``cls`` does not name a launcher or its settings class is not a LauncherSettings."""
    cls = launcher_class(cfg)
    declared = cls.settings_class
    if not (isinstance(declared, type) and issubclass(declared, LauncherSettings)):
        raise ValueError(f"launcher.cls {cfg.get('cls')!r}: its settings_class {declared!r} is not a "
                         "launch.base.LauncherSettings subclass (docs/extending.md)")
    return declared


def schema_node(cls: type[Launcher]) -> Any:
    """The schema conf/launcher/<name>.yaml composes on: its settings class with ``name`` and ``cls`` set, and the
    keys it takes from the member's resources as interpolations (field metadata ``composed``)."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(cls.settings_class)
    node.name, node.cls = cls.name, f"{cls.__module__}:{cls.__qualname__}"
    for f in dataclasses.fields(cls.settings_class):
        if "composed" in f.metadata:
            node[f.name] = f.metadata["composed"]
    return node


#: the launchers whose schema this process has put in Hydra's ConfigStore (each compose calls register_schemas)
_REGISTERED: dict[str, type[Launcher]] = {}


def register_schemas() -> None:
    """Every registered launcher's settings in Hydra's ConfigStore as ``launcher/<name>_schema`` (idempotent: one
    already stored is not built again)."""
    from hydra.core.config_store import ConfigStore

    from core.config.group_schemas import store_schemas
    store_schemas(ConfigStore.instance(), "launcher", launchers(), schema_node, _REGISTERED)


def launcher_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The options a launcher class takes: its node less the keys that choose it."""
    return {k: v for k, v in cfg.items() if k not in RESERVED_KEYS}


def build_launcher(cfg: Mapping[str, Any]) -> Launcher:
    return launcher_class(cfg)(**launcher_options(cfg))


def launcher_plan(cfg: Mapping[str, Any], context: PlanContext) -> LauncherPlan:
    """The configured launcher's part of a dry-run plan, in one call (Launcher.plan)."""
    return launcher_class(cfg).plan(str(cfg.get("name")), launcher_options(cfg), context)


def check_gpu_sharing(cfg: Mapping[str, Any]) -> None:
    """ValueError when ``launcher.gpu_sharing`` names a mode the launcher class does not declare."""
    mode = cfg.get("gpu_sharing")
    if mode is None:
        return
    modes = launcher_class(cfg).gpu_sharing
    if mode not in modes:
        raise ValueError(f"launcher.gpu_sharing={mode!r} is not a mode of launcher={cfg.get('name')}; its modes: "
                         f"{list(modes) or 'none (its members do not choose how they share a GPU)'}")


def runner_policy(retries: int, timeout_s: float, launcher_cfg: Mapping[str, Any]) -> RunnerPolicy:
    return RunnerPolicy(
        retries=int(retries),
        timeout_s=float(timeout_s),
        kill_grace_s=float(launcher_cfg.get("kill_grace_s", DEFAULT_KILL_GRACE_S)),
        max_lost_resubmits=int(launcher_cfg.get("max_lost_resubmits", DEFAULT_MAX_LOST_RESUBMITS)),
        max_pending_s=_optional_float(launcher_cfg.get("max_pending_s")),
        result_grace_s=_result_grace_s(launcher_cfg.get("result_grace_s", 0.0)),
    )


def _result_grace_s(value: Any) -> float:
    """launcher.result_grace_s: seconds >= 0; ValueError naming the key otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"launcher.result_grace_s={value!r} is invalid: use seconds >= 0 (0 on a local filesystem, "
            "~60-90 on NFS, where a file written on another node can stay invisible for up to ~60 s)"
        )
    return float(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def job_namespace(cfg: Mapping[str, Any]) -> str:
    """Where the configured launcher's job ids mean something (Launcher.job_namespace); ValueError when the
    cluster cannot be asked."""
    return launcher_class(cfg).job_namespace(cfg)
