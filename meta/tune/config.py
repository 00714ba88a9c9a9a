"""The tuner's configuration: a dataclass built from the composed conf/tune.yaml and checked before any trial.

Every check runs before a study is created or a job submitted, and names the key: an unknown key in the space, an
empty or non-positive log range, a one-value choice, an unknown sampler or pruner or an option they do not take.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from meta.search.config import INNER_NODES, ConfigError, check_member_launch, config_hash
from meta.settings.schema import TuneSchema, typed_config
from meta.tune.space import Dimension, around_the_preset, leaves_missing_under, parse_space
from core.config.dotted_keys import select_key
from core.records import gpus_entry

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


@dataclass
class TuneConfig:
    run_dir: str
    seed: int
    dims: list[Dimension]
    trials: int
    parallel: int
    seeds: int
    sampler: str
    pruner: str
    launcher: dict[str, Any]
    inner_entrypoint: str
    inner_timeout_s: float
    inner_config: dict[str, Any]
    sampler_options: dict[str, Any] = field(default_factory=dict)
    pruner_options: dict[str, Any] = field(default_factory=dict)
    storage: str | None = None
    study_name: str | None = None
    inner_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 1
    log_level: str = "INFO"
    dry_run: bool = False
    export: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)

    def member_inner(self, inner_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A trial member's ``inner`` dict: its task/model/divergence/train, options, and the validation split."""
        return {**(inner_config or self.inner_config), "options": dict(self.inner_options),
                "eval_split": "validation", **gpus_entry(self.resources)}


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


def _options(key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}={value!r} must be a mapping of keyword arguments, e.g. {{n_startup_trials: 4}}")
    return dict(value)


def _check_storage(storage: Any) -> str | None:
    if storage is None:
        return None
    if not isinstance(storage, str) or "://" not in storage:
        raise ConfigError(f"tune.storage={storage!r} must be null (a journal file in the run dir) or a database URL "
                          "such as sqlite:////abs/path/study.db or postgresql://user@host/db")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(storage)
    except ArgumentError as exc:
        raise ConfigError(f"tune.storage={storage!r} is not a database URL ({exc})") from None
    return storage


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


def build_tune_config(raw: Mapping[str, Any], conf_dir: Path,
                      compose_choice: Callable[[str, Any], Mapping[str, Any]]) -> TuneConfig:
    """Validate the resolved config into a TuneConfig; ConfigError on the first problem.

    ``compose_choice(group, value)``: the config composed with one choice of a tuned group, to check that every
    tuned leaf under that group exists for each choice and that each choice's run config is valid."""
    for node in ("tune", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/tune.yaml's defaults list")
    typed = typed_config(TuneSchema, raw)  # every key's type, default and range: meta/settings/schema.py
    tune = typed.tune
    if tune.space is not None:
        dims = parse_space(tune.space, raw, conf_dir)
    else:  # the default ranges follow the preset: each contains the value the composed config runs
        dims = around_the_preset(divergence_range(parse_space(tune.default_space, raw, conf_dir), raw), raw)
    if tune.study_name is not None and not tune.study_name.strip():
        raise ConfigError(f"tune.study_name={tune.study_name!r} must be a non-empty string or null")
    if typed.inner.timeout_s is None:
        raise ConfigError("inner.timeout_s=None must be a number of seconds (compose derives it from "
                          "resources.member_time_min)")
    cfg = TuneConfig(
        run_dir=str(typed.run_dir or ""),
        seed=typed.seed,
        dims=dims,
        trials=tune.trials,
        parallel=tune.parallel,
        seeds=tune.seeds,
        sampler=tune.sampler,
        pruner=tune.pruner,
        sampler_options=_options("tune.sampler_options", tune.sampler_options),
        pruner_options=_options("tune.pruner_options", tune.pruner_options),
        storage=_check_storage(tune.storage),
        study_name=tune.study_name,
        launcher=dict(raw["launcher"]),
        inner_entrypoint=typed.inner.entrypoint,
        inner_timeout_s=typed.inner.timeout_s,
        inner_options=dict(typed.inner.options),
        inner_config={node: raw[node] for node in INNER_NODES},
        retries=typed.retries,
        log_level=typed.log_level.upper(),
        dry_run=typed.dry_run,
        export=typed.export,
        resources=dict(raw.get("resources") or {}),
    )
    if cfg.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level={cfg.log_level!r} must be one of DEBUG, INFO, WARNING, ERROR")
    try:
        build_sampler(cfg.sampler, cfg.sampler_options, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{exc} (tune.sampler={cfg.sampler}, tune.sampler_options={cfg.sampler_options})") from None
    try:
        build_pruner(cfg.pruner, cfg.pruner_options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{exc} (tune.pruner={cfg.pruner}, tune.pruner_options={cfg.pruner_options})") from None
    if cfg.pruner != "none" and not select_key(raw, "train.eval_every"):
        raise ConfigError(f"tune.pruner={cfg.pruner} decides from intermediate scores: set train.eval_every (steps "
                          "between intermediate validations), or tune.pruner=none")
    check_member_launch(raw, cfg.launcher, cfg.inner_timeout_s, cfg.inner_entrypoint, cfg.member_inner(),
                        cfg.resources)
    for dim in (d for d in dims if d.is_group):
        for choice in dim.choices:
            composed = compose_choice(dim.key, choice)
            missing = leaves_missing_under(dims, dim.key, composed)
            if missing:
                raise ConfigError(f"tune.space.{missing[0]}: {dim.key}={choice} has no such setting; tune it only "
                                  f"together with choices that have it")
            check_member_launch(composed, cfg.launcher, cfg.inner_timeout_s, cfg.inner_entrypoint,
                                cfg.member_inner({node: composed[node] for node in INNER_NODES}), cfg.resources,
                                where=f" ({dim.key}={choice})")
    return cfg
