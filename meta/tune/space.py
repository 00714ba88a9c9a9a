"""The tuner's search space: ``tune.space`` parsed and checked, sampled into a trial's Hydra overrides.

A dimension is a dotted key of the run's config with a spec: ``[log, low, high]`` (log-uniform float), ``[float, low,
high]``, ``[int, low, high]`` or ``[choice, a, b, ...]``. A key is either a leaf of task/model/divergence/train
(``divergence.coef``) or a config group (``divergence``: its values are file names in conf/divergence/). A trial's
values become ``key=value`` overrides of the same composition ``python -m inner_loop.run`` does, so a tuned setting
means exactly what it means on a command line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from meta.search.config import INNER_NODES, ConfigError
from core.config.dotted_keys import select_key

if TYPE_CHECKING:
    import optuna

KINDS = ("log", "float", "int", "choice")
#: the config groups a trial may choose between (their options are the YAML files of conf/<group>/)
TUNABLE_GROUPS = INNER_NODES


@dataclass(frozen=True)
class Dimension:
    """One tuned key: ``kind`` in KINDS; ``low``/``high`` for numbers, ``choices`` for a choice."""

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    @property
    def is_group(self) -> bool:
        return "." not in self.key

    def suggest(self, trial: "optuna.Trial") -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))  # type: ignore[arg-type]
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.kind == "log")  # type: ignore[arg-type]


_ABSENT = object()


def _leaf_exists(raw: Mapping[str, Any], key: str) -> bool:
    node = select_key(raw, key, _ABSENT)
    return node is not _ABSENT and not isinstance(node, Mapping)


def _number(key: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"tune.space.{key}: {what} {value!r} is not a finite number")
    return float(value)


def parse_dimension(key: str, spec: Any, raw: Mapping[str, Any], conf_dir: Path) -> Dimension:
    """One entry of tune.space, checked against the composed config ``raw``; ConfigError naming the key."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"tune.space: {key!r} is not a config key")
    root = key.split(".", 1)[0]
    if root not in INNER_NODES:
        raise ConfigError(f"tune.space.{key}: only keys under {', '.join(INNER_NODES)} can be tuned (a trial is a "
                          "training run configured like python -m inner_loop.run)")
    if not isinstance(spec, (list, tuple)) or not spec or spec[0] not in KINDS:
        raise ConfigError(f"tune.space.{key}={spec!r}: write [log, low, high], [float, low, high], [int, low, high] "
                          "or [choice, a, b, ...]")
    kind, values = spec[0], list(spec[1:])
    if "." not in key:  # a config group
        if kind != "choice":
            raise ConfigError(f"tune.space.{key}: {key} is a config group; tune it with [choice, a, b, ...] of the "
                              f"files in conf/{key}/")
        known = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        unknown = [v for v in values if str(v) not in known]
        if unknown:
            raise ConfigError(f"tune.space.{key}: {unknown[0]!r} is not a {key} config; known: {', '.join(known)}")
    elif not _leaf_exists(raw, key):
        raise ConfigError(f"tune.space.{key}: no such setting in the composed config (check the spelling against "
                          f"conf/{root}/; a config group is tuned by its name alone, e.g. tune.space.{root})")
    if kind == "choice":
        if len(values) < 2 or len({repr(v) for v in values}) < len(values):
            raise ConfigError(f"tune.space.{key}: a choice needs at least two different values, got {values!r}")
        if any(isinstance(v, (list, dict)) for v in values):
            raise ConfigError(f"tune.space.{key}: choices must be plain values (numbers, strings, booleans)")
        return Dimension(key, kind, choices=tuple(values))
    if len(values) != 2:
        raise ConfigError(f"tune.space.{key}={spec!r}: [{kind}, low, high] takes exactly two bounds")
    low, high = (_number(key, v, bound) for v, bound in zip(values, ("low", "high")))
    if not low < high:
        raise ConfigError(f"tune.space.{key}: the range [{low:g}, {high:g}] is empty (low must be below high)")
    if kind == "log" and low <= 0:
        raise ConfigError(f"tune.space.{key}: a log range needs low > 0, got {low:g}")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise ConfigError(f"tune.space.{key}: an int range needs integer bounds, got [{low:g}, {high:g}]")
    return Dimension(key, kind, low, high)


def parse_space(space: Any, raw: Mapping[str, Any], conf_dir: Path) -> list[Dimension]:
    """tune.space as dimensions, in the order given; ConfigError for any bad entry, naming it."""
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(f"tune.space={space!r} must be a non-empty mapping key: [kind, ...]")
    return [parse_dimension(str(key), spec, raw, conf_dir) for key, spec in space.items()]


def around_the_preset(dims: Sequence[Dimension], raw: Mapping[str, Any]) -> list[Dimension]:
    """The default space's number ranges moved, at the same width, to contain the composed config's own value (the
    preset's: mbpp_qwen3's divergence.coef 10 lies outside a default [1e-4, 1]), centred on it; a range that contains
    it already stays. So tuning a preset never leaves out the setting the preset runs."""
    moved = []
    for dim in dims:
        value = select_key(raw, dim.key)
        if dim.kind in ("log", "float") and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not dim.low <= value <= dim.high and (dim.kind == "float" or value > 0):  # type: ignore[operator]
            if dim.kind == "log":
                half = math.sqrt(dim.high / dim.low)  # type: ignore[operator]
                dim = Dimension(dim.key, dim.kind, value / half, value * half)
            else:
                half = (dim.high - dim.low) / 2.0  # type: ignore[operator]
                dim = Dimension(dim.key, dim.kind, value - half, value + half)
        moved.append(dim)
    return moved


def leaves_missing_under(dims: Sequence[Dimension], group: str, raw: Mapping[str, Any]) -> list[str]:
    """The tuned leaves under ``group`` that the config composed with one of its choices (``raw``) lacks: with
    divergence chosen per trial, divergence.param_transform exists for neural_mirror only."""
    return [d.key for d in dims if not d.is_group and d.key.split(".", 1)[0] == group and not _leaf_exists(raw, d.key)]


def suggest(trial: "optuna.Trial", dims: Sequence[Dimension]) -> dict[str, Any]:
    """The trial's value for every dimension (groups first, so a leaf's override lands on the chosen group)."""
    return {d.key: d.suggest(trial) for d in sorted(dims, key=lambda d: not d.is_group)}


def format_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back exactly (floats by repr: no digit lost)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def trial_overrides(params: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides for a trial's params: groups first (``divergence=kl``), then leaves."""
    keys = sorted(params, key=lambda k: "." in k)
    return [f"{key}={format_value(params[key])}" for key in keys]
