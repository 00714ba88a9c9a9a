"""The tuner's configuration: the composed conf/tune.yaml read through its schema (TuneSchema, meta/settings/schema.py)
and checked before any trial.

Every check runs before a study is created or a job submitted, and names the key: an unknown key in the space, an
empty or non-positive log range, a one-value choice, an unknown sampler or pruner or an option they do not take.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from meta.search.config import CONF_DIR, INNER_NODES, ConfigError, check_member_launch, config_hash
from meta.settings.schema import TuneSchema, typed_config
from meta.tune.space import Dimension, around_the_preset, leaves_missing_under, parse_space

if TYPE_CHECKING:
    import optuna

SAMPLERS = ("tpe", "random", "cmaes")
PRUNERS = ("none", "median", "successive_halving")
#: keys that define what a tune run computes: a resume refuses to change them (trials, parallel, launcher,
#: retries and log_level may change)
STUDY_KEYS = ("seed", "tune.space", "tune.default_space", "tune.seeds", "tune.sampler", "tune.sampler_options",
              "tune.pruner", "tune.pruner_options", "tune.storage", "tune.study_name", "inner.entrypoint",
              "inner.options", *INNER_NODES)


def study_hash(raw: Mapping[str, Any]) -> str:
    """The tune run's config hash: over what the study computes (its space, seeds, sampler, pruner, inner config),
    not the ES search's keys."""
    return config_hash(raw, STUDY_KEYS)


def build_sampler(name: str, options: Mapping[str, Any], seed: int | None) -> "optuna.samplers.BaseSampler":
    """An Optuna sampler by name with the user's keyword options; ValueError/TypeError naming the problem."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **options)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed, **options)
    if name == "cmaes":
        if importlib.util.find_spec("cmaes") is None:
            raise ValueError("tune.sampler=cmaes needs the cmaes package (pip install cmaes), or use tpe or random")
        return optuna.samplers.CmaEsSampler(seed=seed, **options)
    raise ValueError(f"tune.sampler={name!r} is not one of {', '.join(SAMPLERS)}")


def build_pruner(name: str, options: Mapping[str, Any]) -> "optuna.pruners.BasePruner":
    import optuna

    if name == "none":
        if options:
            raise ValueError("tune.pruner=none takes no tune.pruner_options")
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(**options)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(**options)
    raise ValueError(f"tune.pruner={name!r} is not one of {', '.join(PRUNERS)}")


def divergence_range(dims: list[Dimension], raw: Mapping[str, Any]) -> list[Dimension]:
    """The default space with divergence.coef over the range the composed divergence declares (its registry
    entry's tune_range); the space's own range where it declares none."""
    from inner_loop.loss.divergences import divergences

    entry = divergences().get(str((raw.get("divergence") or {}).get("name")))
    if entry is None or entry.tune_range is None:
        return dims
    low, high = entry.tune_range
    return [Dimension(d.key, d.kind, low, high) if d.key == "divergence.coef" and d.kind in ("log", "float") else d
            for d in dims]


def study_space(cfg: TuneSchema, conf_dir: Path = CONF_DIR) -> list[Dimension]:
    """The study's dimensions: tune.space, or the default space with each number range moved (same width) to
    contain the value the composed config runs; ConfigError naming a bad entry."""
    tune = cfg.tune
    if tune.space is not None:
        return parse_space(tune.space, cfg.inner_config, conf_dir)
    return around_the_preset(divergence_range(parse_space(tune.default_space, cfg.inner_config, conf_dir),
                                              cfg.inner_config), cfg.inner_config)


def build_tune_config(raw: Mapping[str, Any], conf_dir: Path,
                      compose_choice: Callable[[str, Any], Mapping[str, Any]]) -> TuneSchema:
    """The resolved config read through TuneSchema (its keys' types, ranges and cross-key checks) and checked for
    what the tune's own modules know: the space, the sampler and pruner Optuna builds, and every member the study
    may run; ConfigError on the first problem.

    ``compose_choice(group, value)``: the config composed with one choice of a tuned group, to check that every
    tuned leaf under that group exists for each choice and that each choice's run config is valid."""
    for node in ("tune", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/tune.yaml's defaults list")
    cfg = typed_config(TuneSchema, raw)  # every key's type, default and range: meta/settings/schema.py
    dims = study_space(cfg, conf_dir)
    tune, resources = cfg.tune, dataclasses.asdict(cfg.resources)
    try:
        build_sampler(tune.sampler, tune.sampler_options, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{exc} (tune.sampler={tune.sampler}, tune.sampler_options={tune.sampler_options})") from None
    try:
        build_pruner(tune.pruner, tune.pruner_options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{exc} (tune.pruner={tune.pruner}, tune.pruner_options={tune.pruner_options})") from None
    check_member_launch(raw, cfg.launcher_node, cfg.inner.timeout_s, cfg.inner.entrypoint, cfg.member_inner(), resources)
    for dim in (d for d in dims if d.is_group):
        for choice in dim.choices:
            composed = compose_choice(dim.key, choice)
            missing = leaves_missing_under(dims, dim.key, composed)
            if missing:
                raise ConfigError(f"tune.space.{missing[0]}: {dim.key}={choice} has no such setting; tune it only "
                                  f"together with choices that have it")
            check_member_launch(composed, cfg.launcher_node, cfg.inner.timeout_s, cfg.inner.entrypoint,
                                cfg.member_inner({node: composed[node] for node in INNER_NODES}), resources,
                                where=f" ({dim.key}={choice})")
    return cfg
