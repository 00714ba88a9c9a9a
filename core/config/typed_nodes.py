"""Config nodes as typed dataclasses, and schema errors as one line naming the key: the one reading every node takes.

Why one owner: the inner config (inner_loop/config.py), the task configs (inner_loop/tasks/), the launchers' options
and the settings take the same YAML / OmegaConf input. Two readers with their own type rules would accept a value in
one node and refuse it in another, with differently worded errors; here one rule per annotation decides, and every
error names the key as the user writes it (``<node>.<key>``).

Why in core/: it is the lowest room every reader may import (meta and the stores may not import inner_loop), and it
needs nothing but the standard library. OmegaConf containers are read as the mappings and sequences they are; the
Hydra entry points resolve interpolations themselves (``OmegaConf.to_container``).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from core.config.plain_data import closest_keys, plain, refuse_unknown_keys

T = TypeVar("T")


#: where the schema of a composed key lives, by its first part: the groups' own (inner_loop.config, meta.searchers and
#: launch.factory register_schemas put them in Hydra's ConfigStore), else the root's
SCHEMA_HOMES = {"": "meta/settings/schema.py", "train": "inner_loop/config.py TrainConfig",
                "divergence": "inner_loop/loss/divergences.py, the divergence's config class",
                "es": "meta/searchers/, the searcher's settings class",
                "launcher": "launch/, the launcher's settings class",
                "model": "inner_loop/models/model_config.py ModelConfig",
                "task": "inner_loop/tasks/, the task's config class"}


def schema_error(exc: BaseException, node: str = "", given: str = "") -> str:
    """An OmegaConf error (a wrong type, a key the schema lacks) as one line naming the key (under ``node``), or what
    the user wrote (``given``: the override)."""
    key = getattr(exc, "full_key", None) or ""
    key = f"{node}.{key}" if node and key else key
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not key:
        return f"{given}: {text}" if given else text
    home = SCHEMA_HOMES.get(key.split(".", 1)[0], SCHEMA_HOMES[""])
    schema = getattr(exc, "object_type", None)
    near = closest_keys(key.rsplit(".", 1)[-1], [f.name for f in dataclasses.fields(schema)]) \
        if text.startswith("Key ") and dataclasses.is_dataclass(schema) else []
    hint = f" (did you mean {', '.join(key.rsplit('.', 1)[0] + '.' + k for k in near)}?)" if "." in key and near else ""
    return f"{given or key}: {text}{hint} (the type and default of {key}: {home})"


def composition_error(exc: BaseException) -> str:
    """A Hydra composition error as one line: with the key a schema refused and where it was set (an override, or
    the config file that set it: ``train.stepz in experiment/mine``) when OmegaConf names one, else its first line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause: BaseException | None = exc
    while cause is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return first
    given = first.removeprefix("Error merging override ").strip()
    if given.startswith("In '"):  # a config file of the composition set it
        given = f"{getattr(cause, 'full_key')} in {given.split(chr(39))[1]}"
    return schema_error(cause, given=given)


def _without_none(hint: Any) -> tuple[Any, bool]:
    """(the annotation with ``None`` taken out, whether ``None`` was allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = tuple(a for a in args if a is not type(None))
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
        raise TypeError(f"{hint}: a union of several types has no reading rule in core/config/typed_nodes.py")
    return hint, False


def typed_value(where: str, value: Any, hint: Any, *, prefix: str = "") -> Any:
    """``value`` (plain data) checked and converted for a field annotated ``hint``; ValueError naming ``where``.

    One rule per annotation, for every config node: numbers written as strings (YAML 1.1 reads ``1e-3`` as one)
    are read as numbers, a list of strings must hold strings, a free-form mapping is kept intact.
    """
    hint, optional = _without_none(hint)
    if hint is Any:  # any value, null included
        return value
    if value is None:
        if optional:
            return None
        raise ValueError(f"{prefix}{where} must not be null")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is dict or origin is dict:
        entries = args[1] if len(args) == 2 else Any
        if entries is Any:
            if not isinstance(value, Mapping):
                raise ValueError(f"{prefix}{where} must be a mapping, got {value!r}")
            return dict(value)
        if entries is float:
            if not isinstance(value, Mapping) or not all(isinstance(v, (int, float)) for v in value.values()):
                raise ValueError(f"{prefix}{where} must be a mapping of names to numbers, got {value!r}")
            return {str(k): float(v) for k, v in value.items()}
    elif hint is list or origin is list:
        if args and args[0] is str:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{prefix}{where} must be a list of strings, got {value!r}")
        elif not isinstance(value, list):
            raise ValueError(f"{prefix}{where} must be a list, got {value!r}")
        return list(value)
    elif hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{prefix}{where} must be true or false, got {value!r}")
        return value
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{prefix}{where} must be an integer, got {value!r}")
        return value
    elif hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{prefix}{where} must be a number, got {value!r}")
        return float(value)
    elif hint is str:
        if not isinstance(value, (str, Path)):
            raise ValueError(f"{prefix}{where} must be a string, got {value!r}")
        return str(value)
    raise TypeError(f"{where}: the annotation {hint} has no reading rule in core/config/typed_nodes.py")


def typed_node(cls: type[T], data: Mapping[str, Any] | None, node: str, *, prefix: str = "", see: str = "") -> T:
    """Dataclass ``cls`` from the config node ``data`` (None: all defaults), unknown keys and wrong types refused
    with messages naming ``<node>.<key>`` (``prefix`` and ``see`` as in :func:`refuse_unknown_keys`)."""
    values = plain(data or {})
    refuse_unknown_keys(values, (f.name for f in dataclasses.fields(cls)), node,  # type: ignore[arg-type]
                        prefix=prefix, see=see)
    hints = typing.get_type_hints(cls)
    return cls(**{k: typed_value(f"{node}.{k}", v, hints[k], prefix=prefix) for k, v in values.items()})


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    """ValueError naming ``key`` when ``value`` is not among the ``allowed`` choices (a closed set of a node's key)."""
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {list(allowed)}")
