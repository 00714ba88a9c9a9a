"""Turn evotorch's functional states (nested NamedTuples) into plain dicts and back.

``torch.load(weights_only=True)`` refuses NamedTuples, and a state file must load without unpickling code,
so states are stored as {"__namedtuple__": "module:Class", "fields": {...}} and rebuilt only for classes
from the evotorch package.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

_TAG = "__namedtuple__"
_ALLOWED_PREFIX = "evotorch."


def to_plain(value: Any) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        cls = type(value)
        return {_TAG: f"{cls.__module__}:{cls.__qualname__}", "fields": {k: to_plain(getattr(value, k)) for k in value._fields}}
    if isinstance(value, tuple):
        return {"__tuple__": [to_plain(v) for v in value]}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    raise TypeError(f"cannot serialise searcher state value of type {type(value).__name__}")


def from_plain(value: Any) -> Any:
    if isinstance(value, dict) and _TAG in value:
        target = value[_TAG]
        module_name, _, qualname = target.partition(":")
        if not module_name.startswith(_ALLOWED_PREFIX):
            raise ValueError(f"refusing to rebuild state class {target!r} (only evotorch classes are allowed)")
        cls = getattr(importlib.import_module(module_name), qualname)
        return cls(**{k: from_plain(v) for k, v in value["fields"].items()})
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(from_plain(v) for v in value["__tuple__"])
    if isinstance(value, dict):
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value
