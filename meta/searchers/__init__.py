"""ES searchers behind one ask/tell interface (base.py), one strategy per module; the registry is here, at the door.

The strategy modules are imported when a searcher is first asked for: several import evotorch (and ray), which
takes seconds that ``meta.status`` and the other light commands should not pay.
"""
from __future__ import annotations

import importlib.util
import inspect
from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, EarlyStopRule, Searcher, check_population


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


def build_searcher(
    es_cfg: Mapping[str, Any], center_init: torch.Tensor, popsize: int, seed: int
) -> Searcher:
    """Instantiate ``es_cfg['name']`` with the remaining keys as hyperparameters (es.radius among them); unknown keys
    are errors."""
    cfg = dict(es_cfg)
    cls = searcher_class(str(cfg.pop("name", "")))
    check_importable(cls)
    allowed = [
        p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(f"es.{unknown[0]} is not a setting of es={cls.name}; known settings: {sorted(allowed)}")
    return cls(center_init.to(DTYPE), popsize, seed, **cfg)


__all__ = ["EarlyStopRule", "Searcher", "build_searcher", "check_importable", "check_population", "missing_imports",
           "searcher_class", "searchers"]
