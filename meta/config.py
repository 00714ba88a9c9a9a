"""The orchestrator's configuration: a dataclass built from the composed Hydra config and validated up front.

Every check here runs before anything is written or submitted, and each failure names the key and the fix,
so a typo costs seconds instead of a generation of cluster time.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

INNER_NODES = ("task", "model", "divergence", "train")
# Keys that change what the search computes; a resume refuses to change them.
SEARCH_KEYS = ("population", "seed", "es", "init", "fitness_on_failure", "common_random_numbers", "inner.entrypoint",
               "inner.options", *INNER_NODES)


class ConfigError(ValueError):
    """A user mistake in the configuration (exit status 2, no traceback)."""


@dataclass
class SearchConfig:
    population: int
    generations: int
    seed: int
    run_dir: str
    es: dict[str, Any]
    launcher: dict[str, Any]
    inner_entrypoint: str
    inner_timeout_s: float
    inner_options: dict[str, Any] = field(default_factory=dict)
    inner_config: dict[str, Any] = field(default_factory=dict)
    init: str = "uniform"
    fitness_on_failure: float = 0.0
    max_failed_fraction: float = 0.5
    retries: int = 1
    common_random_numbers: bool = True
    log_level: str = "INFO"

    def member_inner(self) -> dict[str, Any]:
        """The ``inner`` dict of every member spec: resolved task/model/divergence/train plus options."""
        return {**self.inner_config, "options": dict(self.inner_options)}


def config_hash(raw: Mapping[str, Any]) -> str:
    """Hash of the keys that define the search (provenance for exported inits)."""
    picked = _str_keys({key: _get_dotted(raw, key) for key in SEARCH_KEYS})
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _str_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _str_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_str_keys(v) for v in value]
    return value


def _get_dotted(raw: Mapping[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _int(raw: Mapping[str, Any], key: str, minimum: int) -> int:
    value = _get_dotted(raw, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum} (e.g. {key}={max(minimum, 2)})")
    return value


def _float(raw: Mapping[str, Any], key: str, low: float = -math.inf, high: float = math.inf) -> float:
    value = _get_dotted(raw, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} must be a finite number")
    if not low <= value <= high:
        raise ConfigError(f"{key}={value!r} must be between {low} and {high}")
    return float(value)


def build_search_config(raw: Mapping[str, Any]) -> SearchConfig:
    """Validate the resolved config (a plain dict) into a SearchConfig; ConfigError on the first problem."""
    for node in ("es", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/config.yaml's defaults list")
    population = _int(raw, "population", 2)
    cfg = SearchConfig(
        population=population,
        generations=_int(raw, "generations", 1),
        seed=_int(raw, "seed", 0),
        run_dir=str(raw.get("run_dir") or ""),
        es=dict(raw["es"]),
        launcher=dict(raw["launcher"]),
        inner_entrypoint=str(_get_dotted(raw, "inner.entrypoint") or ""),
        inner_timeout_s=_float(raw, "inner.timeout_s", 1e-3),
        inner_options=dict(_get_dotted(raw, "inner.options") or {}),
        inner_config={node: raw[node] for node in INNER_NODES},
        init=str(raw.get("init", "uniform")),
        fitness_on_failure=_float(raw, "fitness_on_failure"),
        max_failed_fraction=_float(raw, "max_failed_fraction", 0.0, 1.0),
        retries=_int(raw, "retries", 0),
        common_random_numbers=bool(raw.get("common_random_numbers", True)),
        log_level=str(raw.get("log_level", "INFO")).upper(),
    )
    if cfg.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level={cfg.log_level!r} must be one of DEBUG, INFO, WARNING, ERROR")
    _check_components(cfg)
    return cfg


def _check_components(cfg: SearchConfig) -> None:
    """Import and try-build the pieces the run will need (searcher, init, entry point, launcher)."""
    from launch.factory import RESERVED_KEYS, launcher_class
    from launch.member import load_entrypoint
    from meta.init import initial_center
    from meta.searchers import build_searcher

    try:
        center = initial_center(cfg.init, cfg.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        build_searcher(cfg.es, center, cfg.population, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        entrypoint = load_entrypoint(cfg.inner_entrypoint)
    except ValueError as exc:
        raise ConfigError(f"{exc}; set inner.entrypoint=package.module:function") from None
    # An entry point may carry its own up-front check of the inner config (`fn.validate(inner)`), so that
    # a bad task/model/divergence/train setting fails here instead of in every submitted member.
    validate = getattr(entrypoint, "validate", None)
    if callable(validate):
        try:
            validate(cfg.member_inner())
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigError(str(exc)) from None
    try:
        launcher_class(cfg.launcher).validate_options(
            {k: v for k, v in cfg.launcher.items() if k not in RESERVED_KEYS}
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
