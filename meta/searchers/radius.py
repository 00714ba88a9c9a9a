"""The searchers' one name for their search radius, ``es.radius``, and the names it had before.

Why one name: the per-coordinate spread of a searcher's samples is the one setting every searcher has and the pilot
scans; under a name per searcher (pgpe's ``stdev_init``, cmaes's ``sigma_init``, openai_es_elite's ``sigma``...) each
YAML selected it from a root ``search_radius`` and the pilot looked it up per class. Now every searcher takes
``radius`` and maps it to its own algorithm's argument; conf/config.yaml holds its one default.

A search started before stored its config and its command line under the former names. Those are read as the radius
(``with_radius_renamed``, ``renamed_override``) so that it resumes, hashes and re-evaluates as the same search; a
former name on a new command line is refused naming ``es.radius`` (``refuse_former_radius``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

#: the es key of every searcher's search radius
RADIUS_KEY = "radius"
#: the searchers' own keys for it before (pgpe, snes, cem: stdev_init; cmaes: sigma_init; openai_es_elite, nres: sigma)
FORMER_KEYS = ("stdev_init", "sigma_init", "sigma")
#: the root key the presets set it through then (each es YAML read ``${oc.select:search_radius,0.01}``)
FORMER_ROOT_KEY = "search_radius"


def renamed_es(es: Mapping[str, Any], root_radius: Any = None) -> dict[str, Any]:
    """An es node with a former radius key (or, lacking one, the former root ``search_radius``) as ``radius``."""
    out = dict(es)
    if RADIUS_KEY in out:
        return out
    former = next((key for key in FORMER_KEYS if key in out), None)
    if former is not None:
        out[RADIUS_KEY] = out.pop(former)
    elif root_radius is not None:
        out[RADIUS_KEY] = root_radius
    return out


def with_radius_renamed(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a run dir's config.yaml) as it reads under ``es.radius``: the former key of its es node moved
    there, the former root key dropped (its value the radius where the es node had none, as in a tuning's config)."""
    out = dict(raw)
    root_radius = out.pop(FORMER_ROOT_KEY, None)
    es = out.get("es")
    if isinstance(es, Mapping):
        out["es"] = renamed_es(es, root_radius)
    elif root_radius is not None:
        out["es"] = {RADIUS_KEY: root_radius}
    return out


def _former_key(override: str) -> str | None:
    """The former radius key an override sets (``es.stdev_init=0.1``, ``search_radius=0.1``, ``+es.sigma=...``)."""
    key = override.partition("=")[0].strip().lstrip("+~")
    if key == FORMER_ROOT_KEY or key in (f"es.{k}" for k in FORMER_KEYS):
        return key
    return None


def renamed_override(override: str) -> str:
    """A stored command-line override under its name now: ``es.stdev_init=0.1`` -> ``es.radius=0.1``."""
    if _former_key(override) is None:
        return override
    key, sep, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+~"))].replace("+", "")  # es.radius exists: set, never add
    return f"{prefix}es.{RADIUS_KEY}{sep}{value}"


def refuse_former_radius(overrides: Sequence[str]) -> None:
    """ValueError naming ``es.radius`` for a new command line that sets the radius under a former name."""
    for override in overrides:
        key = _former_key(override)
        if key is not None:
            value = override.partition("=")[2]
            raise ValueError(f"{key} is now es.{RADIUS_KEY}, the one key of every searcher's search radius: set "
                             f"es.{RADIUS_KEY}={value or '0.01'} instead of {override.strip()}")
