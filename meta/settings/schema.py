"""The schemas of conf/config.yaml (meta.run, meta.pilot) and conf/tune.yaml (meta.tune): dataclasses registered in
Hydra's ConfigStore, each field the one home of its key's type, default and allowed range.

Why dataclasses: Hydra composes ``base_config`` (SearchSchema; ``tune_base_config``, TuneSchema) first, so a YAML file or preset only overrides; a key
the schema lacks, or a value of the wrong type, is refused while composing, before anything is written. A value's
range lives in the field's metadata (``at_least``, ``between``) and :func:`check_ranges` reads it, so a bound is
written once, beside the default. :func:`typed_config` gives a plain config (a stored run's config.yaml, or a test's
dict) the same reading: unknown keys in the schema's nodes refused in the words of refuse_unknown_keys, values
converted or refused naming the key, missing keys filled with their defaults.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, TypeVar

from meta.settings.early_stop import EarlyStopConfig
from meta.settings.reevaluate import ReevaluateConfig
from core.config.dotted_keys import select_key
from core.config.horizon import MEMBER_STEPS_KEY, member_train
from core.config.plain_data import plain, refuse_unknown_keys
from core.config.typed_nodes import schema_error
from core.gpu_time import GpuSharing, gpu_sharing
from meta.settings.keys import INNER_NODES
from meta.settings.upgrade import retired_setting_refusal
from core.records import gpus_entry
from launch.base import LauncherSettings
from meta.searchers.base import SearcherSettings

T = TypeVar("T")

#: the ConfigStore names of the root schemas, first in the defaults lists of conf/config.yaml and conf/tune.yaml
BASE_CONFIG = "base_config"
TUNE_BASE_CONFIG = "tune_base_config"


class ConfigError(ValueError):
    """A user mistake in the configuration (exit status 2, no traceback)."""


def at_least(low: float) -> dict[str, Any]:
    """Field metadata: the value must be >= ``low``."""
    return {"low": low}


def between(low: float, high: float) -> dict[str, Any]:
    """Field metadata: the value must lie in [``low``, ``high``]."""
    return {"low": low, "high": high}


def _free() -> Any:
    """A free-form node (whose keys its own reader checks)."""
    return field(default_factory=dict)


def _inner_group() -> Any:
    """A node of the member's inner config: typed by the inner loop's own schema, which its group's YAML names
    (inner_loop.config.register_schemas), not here: meta names the member program by a string and leans on none of
    its classes (a synthetic program runs on the same config); the program's validate reads the node again, before
    anything is written."""
    return field(default_factory=dict)


@dataclass
class Resources:
    """``resources.*``: what one member needs, whichever launcher runs it (docs/gpus.md, docs/usage.md)."""

    #: GPUs per member (0 or 1); >= 1: the member refuses to train without a usable GPU
    gpus: int = 0
    #: a GPU member's share of its GPU's memory (null: all of it, one member per GPU)
    gpu_memory_fraction: Optional[float] = None
    #: members sharing one GPU: 1, 2 or 4 (core/gpu_time.py checks it)
    members_per_gpu: int = 1
    #: measured, per members_per_gpu k: a member's running time when k share one GPU over its time alone ({2: 1.183})
    shared_slowdown: Dict[Any, Any] = field(default_factory=dict)
    #: where and how shared_slowdown was measured (the plan prints it beside the figure)
    shared_slowdown_source: Optional[str] = None
    #: CPU cores per member: the member's torch threads
    cpus: Any = "${train.num_threads}"
    #: host memory per member; null: the cluster's default
    mem_gb: Any = None
    #: realistic running time of one member, minutes; null: train.steps x step_time_s / 60 + overhead_min
    member_time_min: Optional[float] = field(default=3.0, metadata={"low": 1e-3})
    #: measured seconds per training step on the target GPU
    step_time_s: Optional[float] = field(default=None, metadata={"low": 1e-6})
    #: where and how step_time_s was measured
    step_time_source: Optional[str] = None
    #: minutes per member besides the steps: model load, checkpoints, validations
    overhead_min: float = field(default=0.0, metadata=at_least(0.0))
    #: minutes besides the steps of a search member shorter than train.steps (es.member_steps, an es=nres
    #: truncation): process start, model load and compile, its checkpoint and its one validation, without the whole
    #: run's other checkpoints; null: overhead_min
    short_run_overhead_min: Optional[float] = field(default=None, metadata=at_least(0.0))
    #: inner.timeout_s (when null) = member_time_min x 60 x timeout_factor
    timeout_factor: float = field(default=2.0, metadata=at_least(1.0))


@dataclass
class Inner:
    """``inner.*``: how a member is called."""

    #: module:attr naming a MemberProgram (or a plain fn(spec) -> result record)
    entrypoint: str = "inner_loop.member.entry:program"
    #: free-form, passed to the member program (synthetic objectives)
    options: Dict[str, Any] = _free()
    #: one member's running-time budget in seconds over its requeues; null: resources.member_time_min x 60 x
    #: resources.timeout_factor (meta/config_resources.py fills it in)
    timeout_s: Optional[float] = field(default=None, metadata={"low": 1e-3})


@dataclass
class Stage:
    """``stage.*``: what members read from the Hugging Face hub, fetched once before the first submission."""

    #: the stage cache (a hub cache, on the shared filesystem); null: $MIRROR_ES_CACHE/hub
    cache_dir: Optional[str] = None
    #: revision per repo id; unnamed ones: main, pinned at staging
    revisions: Dict[str, Any] = _free()
    #: the model files fetched (snapshot_download allow_patterns); null: inner_loop/member/staging.py MODEL_PATTERNS
    model_patterns: Optional[List[str]] = None


@dataclass
class Reevaluate:
    """``reevaluate.*``: the two stages after a search (docs/result_table.md): selection (the ``top_k`` members and
    the final centre on ``seeds`` fresh seeds each) and reporting (the exported init and every baseline on
    ``report_seeds`` other seeds)."""

    top_k: int = field(default=3, metadata=at_least(0))
    seeds: int = field(default=3, metadata=at_least(1))
    report_seeds: int = field(default=3, metadata=at_least(0))
    #: null: every row (meta.settings.reevaluate.baselines()); or a list of rows, ``<row>@<preset file>`` for a tuned one
    baselines: Optional[List[str]] = None
    #: tasks scored zero-shot by every reporting run on its trained model
    transfer: List[str] = field(default_factory=list)
    #: reporting runs also score the task's test split
    test: bool = True


@dataclass
class PilotConfig:
    """``pilot.*`` (python -m meta.pilot, docs/pilot.md). radii / coefs null: the es config's radius /
    divergence.coef."""

    #: k: seeds of each init; the centre and every pair member train on the same k seeds
    seeds: int = field(default=3, metadata=at_least(2))
    #: m: antithetic pairs c + e_i, c - e_i per combination
    pairs: int = field(default=4, metadata=at_least(1))
    #: search radii to scan, e.g. [0.005, 0.01, 0.02]
    radii: Optional[List[float]] = None
    #: divergence.coef values to scan, e.g. [0.3, 1.0]
    coefs: Optional[List[float]] = None
    #: the SNR of one generation's ES step that the recommended population must reach
    target_snr: float = 1.0
    #: a path: write the recommendation there as a preset YAML (not recorded)
    export: Optional[str] = None


@dataclass
class RunSchema:
    """The keys meta.run, meta.pilot and meta.tune share: the member's groups and settings, the run's own keys, and
    the keys a preset of conf/experiment/ sets for whichever command composes it."""

    task: Dict[str, Any] = _inner_group()
    model: Dict[str, Any] = _inner_group()
    divergence: Dict[str, Any] = _inner_group()
    train: Dict[str, Any] = _inner_group()
    #: how members run: the launcher group's option composes its launcher's settings class here (launcher/<name>_schema,
    #: a LauncherSettings subclass owned by the launcher class: launch/), or, for a YAML that names its class alone, the
    #: keys every launcher has
    launcher: LauncherSettings = field(default_factory=LauncherSettings)
    resources: Resources = field(default_factory=Resources)
    inner: Inner = field(default_factory=Inner)
    stage: Stage = field(default_factory=Stage)
    #: every draw derives from (seed, generation, purpose); a study's sampler and runs are seeded from it too
    seed: int = field(default=0, metadata=at_least(0))
    #: null: outputs/<command>_<timestamp>; an existing run dir resumes that run
    run_dir: Optional[str] = None
    #: true: a run_dir that does not exist starts a new run there (a mistyped resume path never does; never recorded)
    new: bool = False
    #: extra attempts for a failed / timed-out member (a study's pruned runs are never retried)
    retries: int = field(default=1, metadata=at_least(0))
    log_level: str = "INFO"
    #: true: validate and print the plan and its cost; submit and write nothing
    dry_run: bool = False
    #: a preset's coefficient per divergence (keys: options of the divergence group), read by conf/divergence/*.yaml
    coef_by_divergence: Dict[str, Any] = _free()

    @property
    def inner_config(self) -> dict[str, Any]:
        """The member's run config: task, model, divergence, train (each node as its inner-loop schema read it)."""
        return {node: getattr(self, node) for node in INNER_NODES}

    @property
    def launcher_node(self) -> dict[str, Any]:
        """The launcher node as the launchers read it (launch/factory.py takes the node as a mapping)."""
        return dataclasses.asdict(self.launcher)

    @property
    def full_steps(self) -> int:
        """train.steps: a whole run's length (the exported single run's, a selection, reporting or tune trial run's);
        the one read of the key outside a member's segment."""
        return train_steps(self.inner_config)

    @property
    def resources_node(self) -> dict[str, Any]:
        """The resources node as a mapping: what core/gpu_time.py, core/records.py gpus_entry and the launchers'
        plans read."""
        return dataclasses.asdict(self.resources)

    def _require_timeout(self) -> None:
        """inner.timeout_s given: compose derives it from the resources, a config read otherwise must carry it."""
        if self.inner.timeout_s is None:
            raise ConfigError("inner.timeout_s=None must be a number of seconds (compose derives it from "
                              "resources.member_time_min)")

    def _check_log_level(self) -> None:
        """log_level, upper-cased in place: one of the levels logging knows."""
        self.log_level = self.log_level.upper()
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"log_level={self.log_level!r} must be one of DEBUG, INFO, WARNING, ERROR")


@dataclass
class SearchSchema(RunSchema):
    """The root of conf/config.yaml (meta.run, meta.pilot): every key, its type and its default."""

    #: the searcher and its settings: the es group's option composes its searcher's settings class here
    #: (es/<name>_schema, a SearcherSettings subclass owned by the searcher: meta/searchers/), which holds es.radius
    #: and es.member_steps, the keys every searcher has
    es: SearcherSettings = field(default_factory=SearcherSettings)
    #: members per generation (even for antithetic searchers)
    population: int = field(default=4, metadata=at_least(2))
    generations: int = field(default=2, metadata=at_least(1))
    #: centre init: uniform | gaussian | path to an init file
    init: str = "uniform"
    #: fitness given to members that failed after all retries
    fitness_on_failure: float = field(default=0.0, metadata=at_least(-math.inf))
    #: abort the run when more than this fraction of a generation fails
    max_failed_fraction: float = field(default=0.5, metadata=between(0.0, 1.0))
    #: all members of a generation train with the same seed
    common_random_numbers: bool = True
    #: training runs per member, on the same seeds for every member of a generation; fitness: their mean
    seeds_per_member: int = field(default=1, metadata=at_least(1))
    #: per generation, one more member: the unperturbed centre trained with the generation's seed
    control_member: bool = True
    #: stopping clear losers at an early validation step (meta/search/generation/early_stop.py)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    #: fraction of the population after which a generation may close (1.0: wait for all)
    quorum: float = field(default=1.0, metadata=between(0.0, 1.0))
    #: after the quorum, wait this many x the generation's median member time, then cancel the rest
    straggler_grace: float = field(default=0.5, metadata=at_least(0.0))
    reevaluate: Reevaluate = field(default_factory=Reevaluate)
    pilot: PilotConfig = field(default_factory=PilotConfig)

    def __post_init__(self) -> None:
        """What one key cannot say, checked when a config is read through the schema (typed_config; composing reads
        the fields alone, so compose may derive inner.timeout_s first), in the order meta.run always reported it.
        What needs the search's own modules (its centre, the searcher built, early stopping against the
        generation, the member program and the launcher) is meta/search/config.py build_search_config's."""
        check_ranges(self)  # every key's own range first, as a plain read through the schema names it
        self._require_timeout()
        self.reevaluate_settings  # noqa: B018 (resolved and checked here, once)
        self.member_steps  # noqa: B018 (checked here, once)
        if self.quorum <= 0.0:
            raise ConfigError(f"quorum={self.quorum} must be above 0 (a fraction of the population, 1.0: wait "
                              "for all)")
        self._check_log_level()

    @cached_property
    def reevaluate_settings(self) -> ReevaluateConfig:
        """The reevaluate node resolved (``baselines: null``: every row) and checked across its keys
        (meta/settings/reevaluate.py): what the selection, the reporting and the plan read."""
        try:
            return ReevaluateConfig.from_node(dataclasses.asdict(self.reevaluate))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @cached_property
    def member_steps(self) -> int:
        """Steps of one search member: es.member_steps, checked to be an integer in 1..train.steps; null reads as
        train.steps (0 only with train.steps=0)."""
        steps = train_steps(self.inner_config)
        value = self.es.member_steps
        if value is None:
            return steps
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= steps:
            raise ConfigError(
                f"es.{MEMBER_STEPS_KEY}={value!r} must be an integer from 1 to train.steps={steps} (the steps a "
                f"search member trains; a member longer than the exported run would rank maps on a horizon the run "
                f"never reaches), or null for train.steps: e.g. es.{MEMBER_STEPS_KEY}={max(1, steps // 16)}")
        return value

    @property
    def searcher_settings(self) -> dict[str, Any]:
        """The es node as the searchers read it (a mapping), without the search's own es.member_steps."""
        return searcher_settings(dataclasses.asdict(self.es))

    @property
    def sharing(self) -> GpuSharing:
        """How many members share one GPU and how much slower each runs (core/gpu_time.py)."""
        return checked_sharing(self.resources_node)

    def member_inner(self) -> dict[str, Any]:
        """The ``inner`` dict of every member spec: task/model/divergence/train plus options (and the GPUs its
        resources ask for, which the member insists on)."""
        return {**self.inner_config, "options": dict(self.inner.options), **gpus_entry(self.resources_node)}

    def search_member_inner(self) -> dict[str, Any]:
        """``member_inner`` of a search member (a generation's population and control member): its train node at
        es.member_steps (member_train); the runs after the search train train.steps."""
        inner = self.member_inner()
        return {**inner, "train": member_train(inner["train"], self.member_steps, self.full_steps)}

    @property
    def search_member_alone_min(self) -> float:
        """``member_alone_min`` of a search member at es.member_steps (an online searcher's: its longest
        truncation)."""
        return self.run_alone_min(self.longest_search_member_steps)

    def run_alone_min(self, steps: int) -> float:
        """Minutes alone on its GPU of a run of its own of ``steps`` steps: a whole run's member_alone_min; a shorter
        one's from the measured step time where one is given (steps x step_time_s + short_run_overhead_min), else
        member_time_min scaled by steps / train.steps."""
        full = self.member_alone_min
        if steps >= self.full_steps:
            return full
        if self.resources.step_time_s is not None:
            return steps_minutes(steps, float(self.resources.step_time_s), self.short_run_overhead_min)
        return full * steps / max(1, self.full_steps)

    def search_alone_h(self, runs: int, piece_steps: int | None) -> tuple[int, float]:
        """(steps, hours alone on a GPU) of ``runs`` search member runs in all: every searcher's plan prices its
        members here. ``piece_steps``: an online searcher's steps in all, its members being pieces of its particles'
        runs of different lengths (meta/searchers/base.py: planned_member_steps), each priced at its steps x
        resources.step_time_s plus short_run_overhead_min (without a measured step time: a whole run's time x its
        share of train.steps); None: each a run of its own of es.member_steps, at search_member_alone_min."""
        if piece_steps is None:
            return runs * self.member_steps, runs * self.search_member_alone_min / 60.0
        step_s = self.resources.step_time_s
        if step_s is None:
            return piece_steps, self.member_alone_min / 60.0 * piece_steps / (self.full_steps or 1)
        return piece_steps, (piece_steps * float(step_s) + runs * self.short_run_overhead_min * 60.0) / 3600.0

    @property
    def short_run_overhead_min(self) -> float:
        """The fixed minutes of a search member shorter than train.steps (es.member_steps, an online searcher's
        truncation): resources.short_run_overhead_min, else the whole run's resources.overhead_min."""
        short = self.resources.short_run_overhead_min
        return float(self.resources.overhead_min or 0.0) if short is None else float(short)

    @property
    def longest_search_member_steps(self) -> int:
        """The most steps one search member trains: es.member_steps, or an online searcher's longest truncation."""
        from meta.searchers import searcher_class

        es = self.searcher_settings
        bound = searcher_class(str(es.get("name", ""))).longest_member_steps(es)
        return self.member_steps if bound is None else int(bound)

    @property
    def search_timeout_s(self) -> float:
        """inner.timeout_s of a search member: the whole run's limit scaled to the longest search member's expected
        time where a measured step time gives it (steps x resources.step_time_s + short_run_overhead_min), so that
        a hung 100-step member does not hold its GPU (and its SLURM array task does not ask for) a 1,600-step run's
        hours. Without a measured step time the whole run's limit stays: a member's fixed cost (model load,
        validation) cannot be told from its steps, and a healthy short member must never be cut."""
        return self.member_timeout_s(self.longest_search_member_steps)

    def member_timeout_s(self, steps: int) -> float:
        """inner.timeout_s of a search member that trains ``steps`` steps (``search_timeout_s``'s rule for any
        length: an online search's generation asks it for its own longest truncation, so a staggered search's first
        generation, whose truncations reach far into the run, does not set every later truncation's limit)."""
        step_s, limit = self.resources.step_time_s, float(self.inner.timeout_s or 0.0)
        if steps >= self.full_steps or step_s is None or self.member_alone_min <= 0:
            return limit
        short = steps_minutes(steps, float(step_s), self.short_run_overhead_min)
        return float(math.ceil(limit * min(1.0, short / self.member_alone_min)))

    @property
    def member_alone_min(self) -> float:
        """A member's expected running time alone on its GPU, minutes: resources.member_time_min (derived from the
        measured step time where one is given), else its time limit, inner.timeout_s."""
        return float(self.resources.member_time_min or float(self.inner.timeout_s or 0.0) / 60.0)

    @property
    def searcher_online(self) -> bool:
        """Whether the searcher trains truncations of its particles' runs (es=nres), not whole runs: such a search
        has no control member, the centre having no run of its own to continue (meta/searchers/base.py:
        Searcher.online)."""
        from meta.searchers import searcher_class

        return searcher_class(str(self.es.name)).online


def searcher_settings(es: Mapping[str, Any]) -> dict[str, Any]:
    """The es node without the search's own key es.member_steps (a member's steps, not a setting of the searcher):
    what the searcher is built from."""
    return {key: value for key, value in es.items() if key != MEMBER_STEPS_KEY}


def train_steps(config: Mapping[str, Any]) -> int:
    """train.steps of a composed config (or of its inner config), checked (the inner config's reader checks the rest
    of train)."""
    steps = select_key(config, "train.steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"train.steps={steps!r} must be an integer >= 0 (e.g. train.steps=60)")
    return steps


def steps_minutes(steps: int, step_s: float, overhead_min: float) -> float:
    """A member's minutes from a measured step time: steps x step_s / 60 + overhead_min, rounded up."""
    return float(math.ceil(steps * step_s / 60.0 + overhead_min))


def checked_sharing(resources: Mapping[str, Any]) -> GpuSharing:
    """core/gpu_time.py's reading of a resources node, ConfigError naming the key: checked up front by every command
    that composes a config, before anything is written."""
    try:
        return gpu_sharing(resources)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass
class TuneNode:
    """``tune.*`` of conf/tune.yaml (python -m meta.tune): Optuna over the inner run's settings (docs/usage.md)."""

    # (space and the options: Any, checked as mappings by TuneSchema: OmegaConf cannot merge a mapping into a null
    # Optional[Dict] node)
    #: key: [log, low, high] | [float, low, high] | [int, low, high] | [choice, a, b, ...]; null: default_space, each
    #: number range moved (same width) to contain the value the composed config runs. A separate key because Hydra
    #: merges a dict given for a dict: setting space replaces the default whole instead of adding to it
    space: Any = None
    default_space: Dict[str, Any] = field(default_factory=lambda: {
        "divergence.coef": ["log", 1.0e-4, 1.0], "train.learning_rate": ["log", 1.0e-5, 1.0e-3]})
    #: trials that end complete, pruned or failed (a trial the tuner lost is replaced, not counted)
    trials: int = field(default=8, metadata=at_least(1))
    #: trials in flight at once (each with ``seeds`` runs)
    parallel: int = field(default=2, metadata=at_least(1))
    #: training runs per trial (seeds derived from ``seed``); the objective is their mean pass@1
    seeds: int = field(default=1, metadata=at_least(1))
    #: tpe | random | cmaes (needs the cmaes package)
    sampler: str = "tpe"
    #: keyword arguments of the Optuna sampler (e.g. {n_startup_trials: 4} for tpe)
    sampler_options: Any = None
    #: none | median | successive_halving; needs train.eval_every
    pruner: str = "median"
    #: keyword arguments of the Optuna pruner (median waits for 5 finished trials by default)
    pruner_options: Any = None
    #: null: Optuna's JournalStorage file <run_dir>/optuna_journal.log; or an RDB URL (sqlite:////abs/path/study.db)
    storage: Optional[str] = None
    #: null: tune_<run id>
    study_name: Optional[str] = None


@dataclass
class TuneSchema(RunSchema):
    """The root of conf/tune.yaml (meta.tune): every key, its type and its default, and (``__post_init__``) what one
    key cannot say, checked when a config is read through it (typed_config). The space, the sampler and pruner
    Optuna builds and the member program's check are the tune's (meta/tune/config.py build_tune_config)."""

    #: a path: write the best trial's settings as a preset YAML there
    export: Optional[str] = None
    tune: TuneNode = field(default_factory=TuneNode)

    def __post_init__(self) -> None:
        check_ranges(self)  # every key's own range first, as a plain read through the schema names it
        tune = self.tune
        if tune.study_name is not None and not tune.study_name.strip():
            raise ConfigError(f"tune.study_name={tune.study_name!r} must be a non-empty string or null")
        self._require_timeout()
        tune.sampler_options = _options("tune.sampler_options", tune.sampler_options)
        tune.pruner_options = _options("tune.pruner_options", tune.pruner_options)
        _check_storage(tune.storage)
        self._check_log_level()
        if tune.pruner != "none" and not self.train.get("eval_every"):
            raise ConfigError(f"tune.pruner={tune.pruner} decides from intermediate scores: set train.eval_every "
                              "(steps between intermediate validations), or tune.pruner=none")

    def member_inner(self, inner_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A trial member's ``inner`` dict: its task/model/divergence/train, options, and the validation split."""
        return {**(inner_config or self.inner_config), "options": dict(self.inner.options),
                "eval_split": "validation", **gpus_entry(self.resources_node)}


def _options(key: str, value: Any) -> dict[str, Any]:
    """tune.sampler_options or tune.pruner_options: keyword arguments, {} for null."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}={value!r} must be a mapping of keyword arguments, e.g. {{n_startup_trials: 4}}")
    return dict(value)


def _check_storage(storage: Any) -> None:
    """tune.storage: null or a database URL SQLAlchemy reads."""
    if storage is None:
        return
    if not isinstance(storage, str) or "://" not in storage:
        raise ConfigError(f"tune.storage={storage!r} must be null (a journal file in the run dir) or a database URL "
                          "such as sqlite:////abs/path/study.db or postgresql://user@host/db")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(storage)
    except ArgumentError as exc:
        raise ConfigError(f"tune.storage={storage!r} is not a database URL ({exc})") from None


def register() -> None:
    """Put the root schemas in Hydra's ConfigStore (idempotent): ``base_config`` for conf/config.yaml,
    ``tune_base_config`` for conf/tune.yaml, and the train, divergence, es and launcher groups'
    (inner_loop.config.register_schemas). The tune's root stays open (its nodes are typed, its own scalars are
    checked by typed_config in meta/tune/config.py): a preset is shared by meta.run and meta.tune, and the search
    keys it sets (population, quorum, reevaluate) must not stop a study from composing."""
    from hydra.core.config_store import ConfigStore

    from inner_loop.config import register_schemas
    from launch.factory import register_schemas as register_launchers
    from meta.searchers import register_schemas as register_searchers

    register_schemas()  # the train and divergence groups' schemas, which their YAMLs name
    register_searchers()  # the es group's: each searcher's settings class
    register_launchers()  # the launcher group's: each registered launcher's settings class
    store = ConfigStore.instance()
    if f"{BASE_CONFIG}.yaml" in store.repo and f"{TUNE_BASE_CONFIG}.yaml" in store.repo:
        return  # each compose calls this: the root schemas are built once (~14 ms of every compose otherwise)
    store.store(name=BASE_CONFIG, node=SearchSchema)
    store.store(name=TUNE_BASE_CONFIG, node={  # the defaults as written: an instance would run TuneSchema's checks
        f.name: (f.default_factory if _is_node(f) else
                 f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
        for f in dataclasses.fields(TuneSchema)})


def _is_node(f: dataclasses.Field) -> bool:
    """Whether a schema field is a typed node (a dataclass of its own), not a value or a free-form mapping."""
    return isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)


def node_class(kind: type, data: Any) -> type:
    """The dataclass a node of ``kind`` reads ``data`` with: a group's node by the schema its option names (an es node
    by its searcher's settings class), any other node by ``kind`` itself."""
    if kind not in (SearcherSettings, LauncherSettings) or not isinstance(data, Mapping):
        return kind
    from launch.factory import settings_class
    from meta.searchers import searcher_class, settings_class_of

    try:
        if kind is LauncherSettings:
            return settings_class(data)
        return settings_class_of(searcher_class(str(data.get("name", ""))))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _refuse_unknown(schema: type, data: Mapping[str, Any], node: str) -> None:
    """Unknown keys in every dataclass node under ``data`` (``node`` its dotted name), in refuse_unknown_keys' words."""
    for f in dataclasses.fields(schema):
        child, kind = data.get(f.name), f.default_factory
        if _is_node(f) and isinstance(child, Mapping):  # kind: the node's dataclass
            if kind is SearcherSettings and (refusal := retired_setting_refusal(child)):
                raise ConfigError(refusal)  # a stored search's setting its searcher's algorithm retired: not a typo
            kind = node_class(kind, child)  # type: ignore[arg-type]
            where = f"{node}.{f.name}" if node else f.name
            try:
                refuse_unknown_keys(child, [g.name for g in dataclasses.fields(kind)], where)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            _refuse_unknown(kind, child, where)


def typed_config(schema: type[T], raw: Mapping[str, Any], node: str = "") -> T:
    """``raw`` (plain data) read through ``schema``: unknown keys of its nodes and values of the wrong type refused
    naming the key, missing keys at their defaults, ranges checked (:func:`check_ranges`). ``node``: where ``raw``
    sits in the whole config (``resources``); its own unknown keys are refused. Keys at the root of a whole config
    that the schema lacks are left out, not refused: compose refuses them on a command line, and a run's stored
    config keeps the keys of the version that wrote it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    fields = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    if node:  # a node's own keys are the schema's: a typo there must fail, not fall back to a default
        try:
            refuse_unknown_keys(raw, fields, node)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    data = {k: v for k, v in plain(raw).items() if k in fields}
    for key, value in data.items():
        if _is_node(fields[key]) and value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"{node + '.' if node else ''}{key}={value!r} must be a mapping (its keys and "
                              "defaults: meta/settings/schema.py)")
    _refuse_unknown(schema, data, node)
    # a null node (or free-form mapping) reads as its defaults, as it always did
    given = {k: v for k, v in data.items() if v is not None or fields[k].default_factory is dataclasses.MISSING}
    kinds = {k: node_class(fields[k].default_factory, v) for k, v in given.items() if _is_node(fields[k])}
    # a group's node typed by its option's schema: merged first, so the given keys are checked against it
    narrowed = {k: OmegaConf.structured(kind) for k, kind in kinds.items() if kind is not fields[k].default_factory}
    try:
        value = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), narrowed, given))
    except OmegaConfBaseException as exc:
        raise ConfigError(schema_error(exc, node)) from None
    check_ranges(value, f"{node}." if node else "")
    return value  # type: ignore[return-value]


def check_ranges(node: Any, prefix: str = "") -> None:
    """ConfigError for the first field of dataclass ``node`` (nested ones included) outside the range its metadata
    gives, in the words the commands always used (``population=1 must be an integer >= 2``)."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, key + ".")
            continue
        low, high = f.metadata.get("low"), f.metadata.get("high", math.inf)
        if low is None or value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            if value < low:
                raise ConfigError(f"{key}={value!r} must be an integer >= {low} (e.g. {key}={max(int(low), 2)})")
        elif not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} must be a finite number")
        elif not low <= value <= high:
            bound = f"between {low} and {high}" if high != math.inf else f">= {low}"
            raise ConfigError(f"{key}={value!r} must be {bound}")
