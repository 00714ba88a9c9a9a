"""The search's configuration: the composed Hydra config read through its schema (SearchSchema,
meta/settings/schema.py) and checked up front.

Every check runs before anything is written or submitted, and each failure names the key and the fix, so a typo
costs seconds instead of a generation of cluster time. The keys, their types, defaults and ranges, the cross-key checks
the settings can make and the values derived from them are the schema's; this module adds what needs the search's own
modules (which the settings room may not import): the searcher and init built once to try them, early stopping
against the generation, the launcher's and entry point's checks, and the values derived from those (a generation's
shape, the centre, the early-stop step). The names other modules import from here that now live in meta/settings/
(the search keys and hash, the path keys, a member's time) stay importable from here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from meta.search.generation.early_stop import EarlyStopError, check_early_stop
from meta.settings.keys import HOUSEKEEPING_KEYS, INNER_NODES, SEARCH_KEYS, config_hash  # noqa: F401
from meta.settings.member_time import (check_resources as _check_resources, member_sharing,  # noqa: F401
                                       member_time_text)
from meta.settings.paths import CONF_DIR, absolute_overrides, absolute_path, absolute_paths  # noqa: F401
from meta.settings.schema import ConfigError, SearchSchema, typed_config

if TYPE_CHECKING:
    import torch

    from meta.search.generation.generation_shape import GenerationShape


def generation_shape(cfg: SearchSchema) -> "GenerationShape":
    """One generation's members, control member, jobs, quorum count and early-stop capacity: the one count the plan,
    the orchestrator, the quorum, early stopping and the live view share (meta/search/generation/generation_shape.py).
    A function of the config, not a property of its schema: the settings room may not import the search's."""
    from meta.search.generation.generation_shape import GenerationShape

    return GenerationShape.build(cfg.population, cfg.searcher_settings, cfg.control_member, cfg.quorum)


def early_stop_step(cfg: SearchSchema) -> int | None:
    """The training step early_stop decides at (None: early_stop off), its rule checked against the search
    (meta/search/generation/early_stop.py); EarlyStopError naming the key."""
    return check_early_stop(cfg.early_stop.checked(), cfg.searcher_settings, cfg.member_steps,
                            cfg.train.get("eval_every"), generation_shape(cfg))


def param_transform_of(config: Mapping[str, Any]) -> str:
    """divergence.param_transform of a run's config (or of its inner config); the default for a config without a
    divergence block (a synthetic objective, whose vector is used as it is)."""
    from mirror_maps.neural import DEFAULT_PARAM_TRANSFORM

    return str((config.get("divergence") or {}).get("param_transform") or DEFAULT_PARAM_TRANSFORM)


def search_center(cfg: SearchSchema) -> "torch.Tensor":
    """The search's starting centre (meta/search/init.py): ``init`` and ``seed`` read through the search's
    divergence.param_transform (how a member's vector becomes map parameters)."""
    from meta.search.init import initial_center

    return initial_center(cfg.init, cfg.seed, param_transform_of(cfg.inner_config))


def averaged_center_nominated(cfg: SearchSchema) -> bool:
    """Whether selection retrains the searcher's averaged centre beside the final centre: its searcher keeps one
    (meta/searchers/base.py: Searcher.averaged_center, asked of a fresh searcher), so the plan counts its runs."""
    from meta.searchers import build_searcher

    searcher = build_searcher(cfg.searcher_settings, search_center(cfg), generation_shape(cfg).population, cfg.seed)
    return searcher.averaged_center is not None


def build_search_config(raw: Mapping[str, Any]) -> SearchSchema:
    """The search's config: the resolved config (a plain dict: composed, or a run dir's read through its upgrade,
    meta/settings/upgrade.py) read through SearchSchema (each key's type and range, and in its ``__post_init__``
    the cross-key checks the settings can make), then checked for what needs the search's own modules and the
    launcher: the centre and the searcher built, the searcher's own rule, early stopping, the member program and
    the launcher's options. ConfigError on the first problem, before anything is written."""
    for node in ("es", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/config.yaml's defaults list")
    cfg = typed_config(SearchSchema, raw)
    _check_search_components(cfg)
    refusal = _searcher_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)
    try:
        early_stop_step(cfg)
    except EarlyStopError as exc:
        raise ConfigError(str(exc)) from None
    check_member_launch(raw, cfg.launcher_node, cfg.inner.timeout_s, cfg.inner.entrypoint,
                        cfg.member_inner(), cfg.resources_node)
    return cfg


def _check_search_components(cfg: SearchSchema) -> None:
    """Import and try-build the search's own pieces (searcher, init)."""
    from meta.searchers import build_searcher

    try:
        center = search_center(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        build_searcher(cfg.searcher_settings, center, cfg.population, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _searcher_refusal(cfg: SearchSchema) -> str | None:
    """The searcher's own rule across the search's keys (meta/searchers/base.py: Searcher.search_refusal)."""
    from meta.searchers import searcher_class

    es = cfg.searcher_settings
    return searcher_class(str(es.get("name", ""))).search_refusal(es, cfg.full_steps, cfg.member_steps,
                                                                  cfg.seeds_per_member)


def check_member_launch(raw: Mapping[str, Any], launcher: Mapping[str, Any], inner_timeout_s: float,
                        entrypoint_name: str, member_inner: Mapping[str, Any], resources: Mapping[str, Any],
                        where: str = "") -> None:
    """What every member run needs, checked before anything is submitted (meta.run and meta.tune): the
    resources fit the launcher, the member program loads and accepts the inner config (its ``validate``: a bad
    task/model/divergence/train setting fails here, not in every submitted member), and the launcher takes its
    options. ``where`` is added to messages (e.g. which tuned choice failed)."""
    from launch.factory import check_gpu_sharing, launcher_class, launcher_options
    from launch.member import load_program
    from launch.submitit_base import check_gpus_per_member

    _check_resources(raw, launcher, inner_timeout_s)
    try:
        program = load_program(entrypoint_name)
    except ValueError as exc:
        raise ConfigError(f"{exc}; set inner.entrypoint=package.module:program") from None
    try:
        program.validate(member_inner)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"{exc}{where}") from None
    try:
        cls = launcher_class(launcher)
        cls.validate_options(launcher_options(launcher))
        check_gpu_sharing(launcher)
        gpus = resources.get("gpus")
        if isinstance(gpus, int) and not isinstance(gpus, bool):  # the plan's GPU-hours count it on any launcher
            check_gpus_per_member("resources.gpus", gpus)
        cls.check_training_members(launcher)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_members_can_start(launcher: Mapping[str, Any]) -> None:
    """Before a real run submits (meta.run, meta.tune, meta.pilot; not their dry runs, which plan a GPU machine from
    anywhere and warn): local members that ask for a GPU need a GPU slot on this machine, else none could start."""
    from launch.factory import launcher_class

    try:
        launcher_class(launcher).check_can_start(launcher)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
