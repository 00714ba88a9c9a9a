"""The orchestrator's configuration: a dataclass built from the composed Hydra config and validated up front.

Every check here runs before anything is written or submitted, and each failure names the key and the fix,
so a typo costs seconds instead of a generation of cluster time. The keys, their types, defaults and ranges are
the schema's (meta/settings/schema.py); this module adds what a single key cannot say: cross-key checks, the
searcher and init built once to try them, and the launcher's and entry point's checks. The names other modules
import from here that now live in meta/settings/ (the search keys and hash, the path keys, a member's time) stay
importable from here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from meta.search.generation.early_stop import EarlyStopConfig, EarlyStopError, check_early_stop
from meta.settings.keys import HOUSEKEEPING_KEYS, INNER_NODES, SEARCH_KEYS, config_hash  # noqa: F401
from meta.settings.member_time import (check_resources as _check_resources, member_sharing,  # noqa: F401
                                       member_time_text, steps_minutes, train_steps)
from meta.settings.paths import absolute_overrides, absolute_path, absolute_paths  # noqa: F401
from meta.settings.schema import ConfigError, Reevaluate, SearchSchema, typed_config
from core.records import gpus_entry
from core.config.dotted_keys import select_key
from core.config.groups import group_file
from core.config.horizon import MEMBER_STEPS_KEY

if TYPE_CHECKING:
    import torch

    from meta.search.generation.generation_shape import GenerationShape

#: the Hydra config tree of every command (conf/)
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def searcher_settings(es: Mapping[str, Any]) -> dict[str, Any]:
    """The es node without the search's own key es.member_steps (a member's steps, not a setting of the searcher):
    what the searcher is built from."""
    return {key: value for key, value in es.items() if key != MEMBER_STEPS_KEY}


def member_steps_of(raw: Mapping[str, Any]) -> int:
    """es.member_steps of a composed config, checked: an integer in 1..train.steps, or null (train.steps)."""
    steps = train_steps(raw)
    value = select_key(raw, f"es.{MEMBER_STEPS_KEY}")
    if value is None:
        return steps
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= steps:
        raise ConfigError(
            f"es.{MEMBER_STEPS_KEY}={value!r} must be an integer from 1 to train.steps={steps} (the steps a search "
            f"member trains; a member longer than the exported run would rank maps on a horizon the run never "
            f"reaches), or null for train.steps: e.g. es.{MEMBER_STEPS_KEY}={max(1, steps // 16)}")
    return value


def member_train(train: Mapping[str, Any], member_steps: int) -> dict[str, Any]:
    """The train node of a search member of ``member_steps`` steps: the full run's schedule shrunk to the member's
    own horizon (the cosine decays over its steps, the warm-up is the same fraction of them). The same node when
    member_steps is train.steps."""
    steps = int(train.get("steps") or 0)
    if member_steps == steps:
        return dict(train)
    warmup = int(train.get("lr_warmup_steps") or 0)
    return {**train, "steps": member_steps,
            "lr_warmup_steps": min(member_steps - 1, round(warmup * member_steps / steps)) if warmup else 0}


#: the rows of the result table that are not a divergence's own (meta/search/after/baselines.py says what each row is): those
#: around the search's map come before the divergences' rows, the untrained model after them
MAP_BASELINES = ("center", "nm_random", "radius_random")
UNTRAINED_BASELINE = "base"


def baselines() -> tuple[str, ...]:
    """Every baseline row of the result table: the map rows, each divergence's row (its registry entry says
    whether it has one), the untrained model; ``reevaluate.baselines: null`` trains them all."""
    from inner_loop.loss.divergences import baseline_rows

    return (*MAP_BASELINES, *baseline_rows(), UNTRAINED_BASELINE)
#: separates a baseline's name from the preset file it takes its settings from (``kl@kl_tuned.yaml``)
PRESET_MARK = "@"


@dataclass(frozen=True)
class ReevaluateConfig:
    """What happens after a search, in two stages (meta/search/after/reevaluate.py, meta/search/after/reporting.py). Selection: the
    ``top_k`` members by search fitness and the final centre, each retrained on ``seeds`` fresh seeds; the export is
    the one with the highest mean minus one standard error. Reporting: the exported init and every one of
    ``baselines`` retrained on ``report_seeds`` other fresh seeds (shared by all rows, used for nothing else),
    scored on validation, on the test split (``test``) and on each ``transfer`` task's test split, all from the
    same trained model: the result table."""

    top_k: int = Reevaluate.top_k
    seeds: int = Reevaluate.seeds
    report_seeds: int = Reevaluate.report_seeds
    baselines: tuple[str, ...] = field(default_factory=baselines)
    transfer: tuple[str, ...] = ()
    test: bool = Reevaluate.test


@dataclass
class SearchConfig:
    population: int
    generations: int
    seed: int
    run_dir: str
    es: dict[str, Any]
    launcher: dict[str, Any]
    inner_entrypoint: str
    inner_timeout_s: float
    inner_options: dict[str, Any] = field(default_factory=dict)
    inner_config: dict[str, Any] = field(default_factory=dict)
    # the defaults are the schema's (meta/settings/schema.py SearchSchema), for configs built in code
    init: str = SearchSchema.init
    fitness_on_failure: float = SearchSchema.fitness_on_failure
    max_failed_fraction: float = SearchSchema.max_failed_fraction
    retries: int = SearchSchema.retries
    common_random_numbers: bool = SearchSchema.common_random_numbers
    log_level: str = SearchSchema.log_level
    dry_run: bool = SearchSchema.dry_run
    resources: dict[str, Any] = field(default_factory=dict)
    control_member: bool = SearchSchema.control_member
    quorum: float = SearchSchema.quorum
    straggler_grace: float = SearchSchema.straggler_grace
    reevaluate: "ReevaluateConfig" = field(default_factory=lambda: ReevaluateConfig())
    #: training runs (seeds) per member, the same seeds for every member of a generation; fitness = their mean
    seeds_per_member: int = SearchSchema.seeds_per_member
    #: stopping clear losers at an early validation step (meta/search/generation/early_stop.py); off by default
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    #: the training step early_stop decides at (None: early_stop off)
    early_stop_step: int | None = None
    #: steps of one search member (es.member_steps; train.steps when null); 0 only with train.steps=0
    member_steps: int = 0

    @property
    def launcher_node(self) -> dict[str, Any]:
        """The launcher node as the launchers read it (the same for every program's config: meta/search/recipe.py)."""
        return self.launcher

    def member_inner(self) -> dict[str, Any]:
        """The ``inner`` dict of every member spec: resolved task/model/divergence/train plus options (and the GPUs
        its resources ask for, which the member insists on)."""
        return {**self.inner_config, "options": dict(self.inner_options), **gpus_entry(self.resources)}

    @property
    def full_steps(self) -> int:
        """train.steps: the exported single run's length, and that of the selection and reporting runs."""
        return int(self.inner_config["train"]["steps"])

    def search_member_inner(self) -> dict[str, Any]:
        """``member_inner`` of a search member (a generation's population and control member): its train node at
        es.member_steps (member_train); the runs after the search train train.steps."""
        inner = self.member_inner()
        return {**inner, "train": member_train(inner["train"], self.member_steps)}

    @property
    def search_member_alone_min(self) -> float:
        """``member_alone_min`` of a search member at es.member_steps: from the measured step time where one is given
        (member_steps x step_time_s + short_run_overhead_min), else member_time_min scaled by member_steps / train.steps."""
        full, steps = self.member_alone_min, self.longest_search_member_steps  # an online searcher's: a truncation
        if steps >= self.full_steps:
            return full
        if self.resources.get("step_time_s") is not None:
            return steps_minutes(steps, float(self.resources["step_time_s"]), self.short_run_overhead_min)
        return full * steps / max(1, self.full_steps)

    @property
    def short_run_overhead_min(self) -> float:
        """The fixed minutes of a search member shorter than train.steps (es.member_steps, an online searcher's
        truncation): resources.short_run_overhead_min, else the whole run's resources.overhead_min."""
        short = self.resources.get("short_run_overhead_min")
        return float(self.resources.get("overhead_min") or 0.0) if short is None else float(short)

    @property
    def longest_search_member_steps(self) -> int:
        """The most steps one search member trains: es.member_steps, or an online searcher's longest truncation."""
        from meta.searchers import searcher_class

        bound = searcher_class(str(self.es.get("name", ""))).longest_member_steps(self.es)
        return self.member_steps if bound is None else int(bound)

    @property
    def search_timeout_s(self) -> float:
        """inner.timeout_s of a search member: the whole run's limit scaled to the longest search member's expected
        time where a measured step time gives it (steps x resources.step_time_s + short_run_overhead_min), so that a hung
        100-step member does not hold its GPU (and its SLURM array task does not ask for) a 1,600-step run's hours.
        Without a measured step time the whole run's limit stays: a member's fixed cost (model load, validation)
        cannot be told from its steps, and a healthy short member must never be cut."""
        return self.member_timeout_s(self.longest_search_member_steps)

    def member_timeout_s(self, steps: int) -> float:
        """inner.timeout_s of a search member that trains ``steps`` steps (``search_timeout_s``'s rule for any length:
        an online search's generation asks it for its own longest truncation, so a staggered search's first
        generation, whose truncations reach far into the run, does not set every later truncation's limit)."""
        step_s = self.resources.get("step_time_s")
        if steps >= self.full_steps or step_s is None or self.member_alone_min <= 0:
            return self.inner_timeout_s
        short = steps_minutes(steps, float(step_s), self.short_run_overhead_min)
        return float(math.ceil(self.inner_timeout_s * min(1.0, short / self.member_alone_min)))

    @property
    def member_alone_min(self) -> float:
        """A member's expected running time alone on its GPU, minutes: resources.member_time_min (derived from the
        measured step time where one is given), else its time limit, inner.timeout_s."""
        return float(self.resources.get("member_time_min") or self.inner_timeout_s / 60.0)

    @property
    def generation_shape(self) -> "GenerationShape":
        """One generation's members, control member, jobs, quorum count and early-stop capacity: the one count the
        plan, the orchestrator, the quorum, early stopping and the live view share (meta/search/generation/generation_shape.py)."""
        from meta.search.generation.generation_shape import GenerationShape

        return GenerationShape.build(self.population, self.es, self.control_member, self.quorum)

    @property
    def searcher_online(self) -> bool:
        """Whether the searcher trains truncations of its particles' runs (es=nres), not whole runs."""
        return _online(self.es)

    @property
    def averaged_center_nominated(self) -> bool:
        """Whether selection retrains the searcher's averaged centre beside the final centre: its searcher keeps one
        (meta/searchers/base.py: Searcher.averaged_center, asked of a fresh searcher), so the plan counts its runs."""
        from meta.searchers import build_searcher

        searcher = build_searcher(self.es, self.center(), self.generation_shape.population, self.seed)
        return searcher.averaged_center is not None

    @property
    def param_transform(self) -> str:
        """How a member's vector becomes map parameters (divergence.param_transform)."""
        return param_transform_of(self.inner_config)

    def center(self) -> "torch.Tensor":
        """The search's starting centre (meta/search/init.py): ``init`` and ``seed`` read through ``param_transform``."""
        from meta.search.init import initial_center

        return initial_center(self.init, self.seed, self.param_transform)


def param_transform_of(config: Mapping[str, Any]) -> str:
    """divergence.param_transform of a run's config (or of its inner config); the default for a config without a
    divergence block (a synthetic objective, whose vector is used as it is)."""
    from mirror_maps.neural import DEFAULT_PARAM_TRANSFORM

    return str((config.get("divergence") or {}).get("param_transform") or DEFAULT_PARAM_TRANSFORM)



def build_search_config(raw: Mapping[str, Any]) -> SearchConfig:
    """Validate the resolved config (a plain dict: composed, or a run dir's read through its upgrade,
    meta/settings/upgrade.py) into a SearchConfig; ConfigError on the first problem."""
    for node in ("es", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/config.yaml's defaults list")
    typed = typed_config(SearchSchema, raw)
    if typed.inner.timeout_s is None:
        raise ConfigError("inner.timeout_s=None must be a number of seconds (compose derives it from "
                          "resources.member_time_min)")
    cfg = SearchConfig(
        population=typed.population,
        generations=typed.generations,
        seed=typed.seed,
        run_dir=str(typed.run_dir or ""),
        es=searcher_settings(raw["es"]),
        launcher=dict(raw["launcher"]),
        inner_entrypoint=typed.inner.entrypoint,
        inner_timeout_s=typed.inner.timeout_s,
        inner_options=dict(typed.inner.options),
        inner_config={node: raw[node] for node in INNER_NODES},
        init=typed.init,
        fitness_on_failure=typed.fitness_on_failure,
        max_failed_fraction=typed.max_failed_fraction,
        retries=typed.retries,
        common_random_numbers=typed.common_random_numbers,
        log_level=typed.log_level.upper(),
        dry_run=typed.dry_run,
        resources=dict(raw.get("resources") or {}),
        control_member=typed.control_member,
        quorum=typed.quorum,
        straggler_grace=typed.straggler_grace,
        reevaluate=_reevaluate(typed.reevaluate),
        seeds_per_member=typed.seeds_per_member,
        member_steps=member_steps_of(raw),
    )
    if cfg.quorum <= 0.0:
        raise ConfigError(f"quorum={cfg.quorum} must be above 0 (a fraction of the population, 1.0: wait for all)")
    if cfg.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level={cfg.log_level!r} must be one of DEBUG, INFO, WARNING, ERROR")
    _check_search_components(cfg)
    refusal = _searcher_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)
    try:
        cfg.early_stop = typed.early_stop.checked()
        cfg.early_stop_step = check_early_stop(cfg.early_stop, cfg.es, member_train(raw["train"], cfg.member_steps),
                                               cfg.generation_shape)
    except EarlyStopError as exc:
        raise ConfigError(str(exc)) from None
    check_member_launch(raw, cfg.launcher, cfg.inner_timeout_s, cfg.inner_entrypoint, cfg.member_inner(),
                        cfg.resources)
    return cfg


def _names(key: str, value: Sequence[str]) -> tuple[str, ...]:
    if len(set(value)) != len(value):
        raise ConfigError(f"{key}={list(value)} names a row twice")
    return tuple(value)


def _baselines(value: Sequence[str] | None) -> tuple[str, ...]:
    """reevaluate.baselines: known rows, or ``<row>@<preset file>`` with an existing file (meta/search/after/baselines.py reads
    it); the untrained model has no training settings to take from a preset."""
    key = "reevaluate.baselines"
    known = baselines()
    if value is None:
        return known
    names = _names(key, value)
    for name in names:
        row, mark, path = name.partition(PRESET_MARK)
        if row not in known:
            raise ConfigError(f"{key}: {row!r} is not one of {', '.join(known)} (a tuned row: <row>@<file>)")
        if not mark:
            continue
        if row == UNTRAINED_BASELINE:
            raise ConfigError(f"{key}: {name!r}: the untrained model (base) trains nothing a preset could set")
        if not Path(path).is_file():
            raise ConfigError(f"{key}: {name!r}: no preset file {path} (what meta.tune ... export= writes, or a YAML "
                              "of divergence/train settings)")
    return names


def _reevaluate(node: Reevaluate) -> ReevaluateConfig:
    """The reevaluate node's cross-key checks (each key's type and range: the schema)."""
    if node.top_k and node.seeds < 2:
        raise ConfigError(f"reevaluate.seeds={node.seeds} gives no spread to compare inits by; use 2 or more "
                          "(or reevaluate.top_k=0 to skip re-evaluation)")
    if node.top_k and node.report_seeds == 1:
        raise ConfigError("reevaluate.report_seeds=1 gives no interval; use 2 or more (3+ for a useful one), "
                          "or 0 to skip the result table")
    transfer = _names("reevaluate.transfer", node.transfer)
    missing = [t for t in transfer if group_file(CONF_DIR, "task", t) is None]
    if missing:
        raise ConfigError(f"reevaluate.transfer: {missing[0]!r} is not a task (conf/task/{missing[0]}.yaml)")
    return ReevaluateConfig(top_k=node.top_k, seeds=node.seeds, report_seeds=node.report_seeds,
                            baselines=_baselines(node.baselines), transfer=transfer, test=node.test)


def _check_search_components(cfg: SearchConfig) -> None:
    """Import and try-build the search's own pieces (searcher, init)."""
    from meta.searchers import build_searcher

    try:
        center = cfg.center()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        build_searcher(cfg.es, center, cfg.population, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _searcher_refusal(cfg: SearchConfig) -> str | None:
    """The searcher's own rule across the search's keys (meta/searchers/base.py: Searcher.search_refusal)."""
    from meta.searchers import searcher_class

    return searcher_class(str(cfg.es.get("name", ""))).search_refusal(cfg.es, cfg.full_steps, cfg.member_steps,
                                                                      cfg.seeds_per_member)


def _online(es: Mapping[str, Any]) -> bool:
    """Whether the searcher trains truncations of long runs (es=nres): such a search has no control member, the
    centre having no run of its own to continue (meta/searchers/base.py: Searcher.online)."""
    from meta.searchers import searcher_class

    return searcher_class(str(es.get("name", ""))).online


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
