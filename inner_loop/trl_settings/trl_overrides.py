"""The `train.trl` pass-through and `train.report_to`, checked against TRL's own GRPOConfig fields.

Why apart from building the GRPOConfig (grpo/args.py): the typed config (inner_loop/config.py) checks these
values when it is made, before any model or trainer exists, and must not depend on the module that turns a
whole config into GRPOConfig arguments (which depends on the config). A field set from our own typed keys
(``OWNED_FIELDS``) is refused here, naming the key to use: two ways to set one value would let a preset and an
override silently disagree.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from inner_loop.generation.backends import DECODE_CACHES
from inner_loop.trl_settings.fields import owned_fields
from inner_loop.trl_settings.trl_contract import unsupported_grpo_fields

#: every GRPOConfig field train.trl may not set -> what to use instead (built from trl_settings/fields.py's table)
OWNED_FIELDS: dict[str, str] = owned_fields()
#: train.trl.generation_kwargs entries that would choose HF generate's cache or its compilation behind
#: train.decode_cache (TRL passes generation_kwargs over its own; disable_compile there even breaks TRL's init)
DECODE_CACHE_KWARGS = ("cache_implementation", "disable_compile", "compile_config")
#: String fields whose value TRL checks only when the trainer starts (their help text lists the choices): checked
#: here so that a typo fails up front. Fields whose metadata carries ``choices`` are checked the same way.
_LATE_CHOICES: dict[str, tuple[str, ...]] = {
    "vllm_mode": ("server", "colocate"),
    "vllm_model_impl": ("transformers", "vllm"),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}

@functools.lru_cache(maxsize=1)
def _field_choices() -> dict[str, tuple[Any, ...]]:
    """The allowed values of the GRPOConfig fields that have a closed set of them."""
    from trl import GRPOConfig

    found = {f.name: tuple(f.metadata["choices"]) for f in dataclasses.fields(GRPOConfig) if "choices" in f.metadata}
    return {**found, **_LATE_CHOICES}


@functools.lru_cache(maxsize=1)
def _field_hints() -> dict[str, Any]:
    """Each constructor field of the pinned GRPOConfig and its type."""
    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(GRPOConfig) if f.init}


def trl_version() -> str:
    import trl

    return str(trl.__version__)


def _describe(hint: Any) -> str:
    """A type annotation in the words a YAML user needs."""
    if hint is Any:
        return "any value"
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(a) for a in typing.get_args(hint)))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is list or hint is list:
        args = typing.get_args(hint)
        return f"a list of {_describe(args[0])}s" if args else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "a string naming one of " + ", ".join(repr(m.value) for m in hint)
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, getattr(
        hint, "__name__", str(hint)))


def _matches(value: Any, hint: Any) -> bool:
    """Whether a plain YAML value fits a GRPOConfig annotation (enums take their string value; GRPOConfig then
    checks the value itself)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return any(value is a or (type(value) is type(a) and value == a) for a in typing.get_args(hint))
    if origin is list or hint is list:
        args = typing.get_args(hint)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict or hint is dict:
        args = typing.get_args(hint)
        return isinstance(value, dict) and all(isinstance(k, str) for k in value) and (
            len(args) != 2 or all(_matches(v, args[1]) for v in value.values()))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, str) or isinstance(value, hint)
    return isinstance(hint, type) and isinstance(value, hint)


def _coerce_number(value: Any, hint: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string: read it as the number a float field wants."""
    if isinstance(value, str) and not _matches(value, hint) and _matches(1.0, hint):
        try:
            return float(value)
        except ValueError:
            return value
    return value


#: the module each reporting integration needs (transformers' report_to names); others are looked up by their name
_REPORT_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml",
                   "clearml": "clearml", "neptune": "neptune", "dvclive": "dvclive", "trackio": "trackio"}


def _integration_names() -> list[str]:
    """transformers' reporting integrations (the names ``report_to`` takes)."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return sorted(INTEGRATION_TO_CALLBACK)


def check_report_to(report_to: Any) -> list[str]:
    """``train.report_to`` as a list of transformers' integration names, each installed: a backend that is not would
    otherwise fail in every member when its trainer starts (or, for some, silently log nowhere)."""
    import importlib.util

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [] if names in (["none"], []) else names
    for name in names:
        # the names of _REPORT_MODULES are transformers' own (tests/test_inner_loop/grpo/test_inner_grpo_args.py holds them
        # so); only another name needs transformers' list, whose import costs an orchestrator seconds
        if name not in _REPORT_MODULES and name not in _integration_names():
            raise ValueError(f"train.report_to: {name!r} is not a transformers reporting integration; choose from "
                             f"{_integration_names()} or [] for none")
        module = _REPORT_MODULES.get(name, name)
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"train.report_to: {name!r} needs the {module!r} package, which is not installed here "
                             f"(pip install {module} in this environment, or drop it from train.report_to)")
    return names


def check_trl_overrides(trl: Mapping[str, Any], batch_size: int | None = None) -> dict[str, Any]:
    """Check ``train.trl`` against the pinned GRPOConfig's fields and types; returns it with numbers read as numbers.

    Raises ValueError naming ``train.trl.<key>`` for an unknown field (with the closest field names), a field we
    set from a typed key (naming that key), a value of the wrong type, or a loss option our loss does not honour
    (inner_loop/trl_settings/trl_contract.py). ``batch_size`` (train.batch_size) must split evenly into
    ``gradient_accumulation_steps`` micro-batches. What only GRPOConfig's own checks can tell (values,
    combinations) is left to ``build_grpo_config``.
    """
    if not isinstance(trl, Mapping):
        raise ValueError(f"train.trl must be a mapping of GRPOConfig fields to values, got {trl!r}")
    hints = _field_hints() if trl else {}  # an empty mapping needs no TRL import (seconds)
    out: dict[str, Any] = {}
    for key, value in trl.items():
        where = f"train.trl.{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(f'train.trl.{c}' for c in close)}?" if close else ""
            raise ValueError(f"{where} is not a field of TRL's GRPOConfig (trl {trl_version()}){hint} "
                             "(the fields are listed in trl/trainer/grpo_config.py)")
        if key in OWNED_FIELDS:
            raise ValueError(f"{where} is set by mirror-es itself; use {OWNED_FIELDS[key]} instead")
        value = _coerce_number(value, hints[key])
        if not _matches(value, hints[key]):
            raise ValueError(f"{where} must be {_describe(hints[key])}, got {value!r}")
        choices = _field_choices().get(key)
        if choices and isinstance(value, str) and value not in choices:
            raise ValueError(f"{where}={value!r} is not one of {list(choices)}")
        out[str(key)] = value
    cache_kwargs = [k for k in DECODE_CACHE_KWARGS if k in (out.get("generation_kwargs") or {})]
    if cache_kwargs:
        raise ValueError(f"train.trl.generation_kwargs.{cache_kwargs[0]} is set by mirror-es itself; use "
                         f"train.decode_cache instead ({' | '.join(DECODE_CACHES)})")
    ignored = unsupported_grpo_fields(out)  # loss options our loss would silently not apply
    if ignored:
        raise ValueError("; ".join(ignored))
    accumulation = out.get("gradient_accumulation_steps", 1)
    if accumulation < 1:
        raise ValueError(f"train.trl.gradient_accumulation_steps must be >= 1, got {accumulation}")
    if batch_size is not None and batch_size % accumulation:
        raise ValueError(f"train.batch_size ({batch_size}) must be a multiple of train.trl.gradient_accumulation_steps "
                         f"({accumulation}): train.batch_size is the completions per optimizer step, split into that "
                         "many micro-batches")
    return out
