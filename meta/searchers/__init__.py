"""ES searchers behind one ask/tell interface (base.py), one strategy per module; the registry is here, at the door.

The strategy modules are imported when a searcher is first asked for: several import evotorch (and ray), which
takes seconds that ``meta.status`` and the other light commands should not pay.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, EarlyStopRule, Searcher, SearcherSettings, check_population, setting
from core.config.group_schemas import store_schemas
from core.config.typed_nodes import typed_node
REQUIRED = "???"


def _registry() -> dict[str, type[Searcher]]:
    """The built-in searchers and those installed packages declare under the ``mirror_es.searchers`` entry-point
    group (docs/extending.md): a new searcher is its module and its conf/es YAML, no edit here."""
    from meta.searchers.cem import CEMSearcher
    from meta.searchers.cmaes import CMAESSearcher
    from meta.searchers.nres import NRESSearcher
    from meta.searchers.openai_es import OpenAIESEliteSearcher
    from meta.searchers.pgpe import PGPESearcher
    from meta.searchers.snes import SNESSearcher
    from core.entry_points import entry_point_objects

    classes = [PGPESearcher, SNESSearcher, CEMSearcher, CMAESSearcher, OpenAIESEliteSearcher, NRESSearcher]
    classes += entry_point_objects(
        "searchers", "a meta.searchers.base.Searcher subclass",
        lambda c: c.name if isinstance(c, type) and issubclass(c, Searcher) else None).values()
    return {cls.name: cls for cls in classes}


def searchers() -> dict[str, type[Searcher]]:
    """Every searcher this Python knows, by ``es.name``."""
    return _registry()


def searcher_class(name: str) -> type[Searcher]:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"es.name={name!r} is unknown; choose one of {sorted(registry)} "
                         f"(e.g. es={next(iter(registry))})")
    return registry[name]


def missing_imports(cls: type[Searcher]) -> list[str]:
    """The modules of ``cls.imports`` that cannot be imported here (found without importing them)."""
    missing = []
    for module in cls.imports:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def check_importable(cls: type[Searcher]) -> None:
    """Refuse a searcher whose modules this Python lacks, naming the searchers that would run here.

    Why: an air-gapped GPU node gets its packages from a bundle of wheels, and ray (which evotorch imports at import
    time) is too large to carry; the search must say so before anything is written, not fail in a traceback."""
    missing = missing_imports(cls)
    if missing:
        usable = sorted(name for name, other in _registry().items() if not missing_imports(other))
        raise ValueError(f"es={cls.name} needs {', '.join(cls.imports)}, and {', '.join(missing)} cannot be "
                         f"imported here; searchers that run here: {usable} (e.g. es={usable[0] if usable else '?'}), "
                         f"or install {' '.join(missing)}")


def settings_class_of(cls: type[Searcher]) -> type[SearcherSettings]:
    """The dataclass of ``cls``'s es settings: the one it declares, or for a searcher that declares none (a
    third-party one written before settings classes) one derived once from its constructor's keyword-only
    parameters, each with its default and its default's type (a number, a string or a flag; any value where the
    default is null or a container; a parameter without a default is required)."""
    declared = cls.settings_class
    if declared is not None:
        if not (isinstance(declared, type) and issubclass(declared, SearcherSettings)):
            raise ValueError(f"es={cls.name}: its settings_class {declared!r} is not a SearcherSettings subclass "
                             "(meta.searchers.base.SearcherSettings; docs/extending.md)")
        return declared
    return _derived_settings(cls)


@functools.lru_cache(maxsize=None)
def _derived_settings(cls: type[Searcher]) -> type[SearcherSettings]:
    shared = {f.name for f in dataclasses.fields(SearcherSettings)}
    fields: list[tuple[str, Any, Any]] = []
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.name in shared:
            continue
        default = REQUIRED if p.default is inspect.Parameter.empty else p.default
        kind = type(default) if type(default) in (bool, int, float, str) and default != REQUIRED else Any
        fields.append((p.name, kind, setting(default, f"a keyword of {cls.__name__}")))
    return dataclasses.make_dataclass(f"{cls.__name__}Settings", fields, bases=(SearcherSettings,))


def read_settings(es_cfg: Mapping[str, Any]) -> SearcherSettings:
    """The es node as its searcher's settings class: an unknown key or a value of the wrong type refused naming
    ``es.<key>`` and the searcher's settings, a required one (an interpolation its schema fills where conf/ is
    composed, such as nres's horizon_steps) refused when missing."""
    cls = searcher_class(str(es_cfg.get("name", "")))
    settings = settings_class_of(cls)
    known = sorted(f.name for f in dataclasses.fields(settings) if f.name not in SearcherSettings.SEARCH_OWN)
    unknown = sorted(set(es_cfg) - {f.name for f in dataclasses.fields(settings)})
    if unknown:
        raise ValueError(f"es.{unknown[0]} is not a setting of es={cls.name}; known settings: {known} (their types, "
                         f"defaults and help: {settings.__module__}.{settings.__name__})")
    for f in dataclasses.fields(settings):
        if f.name not in es_cfg and composed_only(f.default):
            raise ValueError(f"es.{f.name} of es={cls.name} is required (its schema: {f.default})")
    return typed_node(settings, es_cfg, "es")


def composed_only(default: Any) -> bool:
    """Whether a setting's default is filled only where conf/ is composed: an interpolation (nres's horizon_steps:
    ${train.steps}) or REQUIRED; a node read without it lacks a value, and a stored node always has the key."""
    return isinstance(default, str) and default.startswith(("${", REQUIRED))


def build_searcher(
    es_cfg: Mapping[str, Any], center_init: torch.Tensor, popsize: int, seed: int
) -> Searcher:
    """The searcher ``es_cfg['name']`` names, built from the es node read as its settings class (es.radius among
    them); unknown keys are errors."""
    cls = searcher_class(str(es_cfg.get("name", "")))
    check_importable(cls)
    return cls(center_init.to(DTYPE), popsize, seed, **read_settings(es_cfg).keywords())


def schema_node(cls: type[Searcher]) -> Any:
    """The schema conf/es/<name>.yaml composes on: the searcher's settings class with its name set."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(settings_class_of(cls))
    node.name = cls.name
    return node


#: the searchers whose schema this process has put in Hydra's ConfigStore (each compose calls register_schemas)
_REGISTERED: dict[str, type[Searcher]] = {}


def register_schemas() -> None:
    """Every registered searcher's settings in Hydra's ConfigStore as ``es/<name>_schema`` (idempotent: a searcher
    already stored is not built again)."""
    from hydra.core.config_store import ConfigStore

    store_schemas(ConfigStore.instance(), "es", _registry(), schema_node, _REGISTERED)


__all__ = ["EarlyStopRule", "Searcher", "SearcherSettings", "build_searcher", "check_importable", "check_population",
           "missing_imports", "read_settings", "register_schemas", "searcher_class", "searchers", "settings_class_of"]
