"""The orchestrator's configuration: a dataclass built from the composed Hydra config and validated up front.

Every check here runs before anything is written or submitted, and each failure names the key and the fix,
so a typo costs seconds instead of a generation of cluster time.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, MutableMapping, Sequence

from meta.search.early_stop import EarlyStopConfig, EarlyStopError, check_early_stop
from core.gpu_time import GpuSharing, gpu_sharing
from core.records import gpus_entry
from core.config_nodes import MEMBER_STEPS_KEY, group_file, plain, refuse_unknown_keys

if TYPE_CHECKING:
    import torch

    from meta.search.generation_shape import GenerationShape

#: the Hydra config tree of every command (conf/)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
INNER_NODES = ("task", "model", "divergence", "train")
# Keys that change what the search computes; a resume refuses to change them.
SEARCH_KEYS = ("population", "seed", "es", "init", "fitness_on_failure", "common_random_numbers", "inner.entrypoint",
               "inner.options", "seeds_per_member", "early_stop", *INNER_NODES)
#: search keys added after runs existed, with the value that reproduces those runs: a run whose config lacks one
#: resumes (and hashes) as if it had this value
ADDED_SEARCH_KEYS = {"seeds_per_member": 1, "early_stop": dataclasses.asdict(EarlyStopConfig()),
                     f"es.{MEMBER_STEPS_KEY}": None}
# Keys inside SEARCH_KEYS that say what a member keeps on disk, not what it computes: a resume may change them
# (e.g. keep checkpoints from now on), and runs started before they existed resume.
HOUSEKEEPING_KEYS = ("train.keep_checkpoints", "train.save_total_limit")


class ConfigError(ValueError):
    """A user mistake in the configuration (exit status 2, no traceback)."""


def with_added_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every ADDED_SEARCH_KEYS key it lacks set to the value that reproduces a run from before the key
    existed (dotted keys inside their node), so that such a run resumes and hashes as it did."""
    out = dict(raw)
    for key, default in ADDED_SEARCH_KEYS.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            if not isinstance(child, Mapping):
                break
            node[part] = node = dict(child)
        else:
            node.setdefault(leaf, default)
    return out


def searcher_settings(es: Mapping[str, Any]) -> dict[str, Any]:
    """The es node without the search's own key es.member_steps (a member's steps, not a setting of the searcher):
    what the searcher is built from."""
    return {key: value for key, value in es.items() if key != MEMBER_STEPS_KEY}


def member_steps_of(raw: Mapping[str, Any]) -> int:
    """es.member_steps of a composed config, checked: an integer in 1..train.steps, or null (train.steps)."""
    steps = _int(raw, "train.steps", 0)
    value = _get_dotted(raw, f"es.{MEMBER_STEPS_KEY}")
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


#: the rows of the result table that are not a divergence's own (meta/after/baselines.py says what each row is): those
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
    """What happens after a search, in two stages (meta/after/reevaluate.py, meta/after/reporting.py). Selection: the
    ``top_k`` members by search fitness and the final centre, each retrained on ``seeds`` fresh seeds; the export is
    the one with the highest mean minus one standard error. Reporting: the exported init and every one of
    ``baselines`` retrained on ``report_seeds`` other fresh seeds (shared by all rows, used for nothing else),
    scored on validation, on the test split (``test``) and on each ``transfer`` task's test split, all from the
    same trained model: the result table."""

    top_k: int = 3
    seeds: int = 3
    report_seeds: int = 3
    baselines: tuple[str, ...] = field(default_factory=baselines)
    transfer: tuple[str, ...] = ()
    test: bool = True


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
    init: str = "uniform"
    fitness_on_failure: float = 0.0
    max_failed_fraction: float = 0.5
    retries: int = 1
    common_random_numbers: bool = True
    log_level: str = "INFO"
    dry_run: bool = False
    resources: dict[str, Any] = field(default_factory=dict)
    control_member: bool = True
    quorum: float = 1.0
    straggler_grace: float = 0.5
    reevaluate: "ReevaluateConfig" = field(default_factory=lambda: ReevaluateConfig())
    #: training runs (seeds) per member, the same seeds for every member of a generation; fitness = their mean
    seeds_per_member: int = 1
    #: stopping clear losers at an early validation step (meta/search/early_stop.py); off by default
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    #: the training step early_stop decides at (None: early_stop off)
    early_stop_step: int | None = None
    #: steps of one search member (es.member_steps; train.steps when null); 0 only with train.steps=0
    member_steps: int = 0

    def member_inner(self) -> dict[str, Any]:
        """The ``inner`` dict of every member spec: resolved task/model/divergence/train plus options (and the GPUs
        its resources ask for, which the member insists on)."""
        return {**self.inner_config, "options": dict(self.inner_options), **gpus_entry(self.resources)}

    @property
    def full_steps(self) -> int:
        """train.steps: the exported single run's length, and that of the selection and reporting runs."""
        return int(self.inner_config["train"].get("steps") or 0)

    def search_member_inner(self) -> dict[str, Any]:
        """``member_inner`` of a search member (a generation's population and control member): its train node at
        es.member_steps (member_train); the runs after the search train train.steps."""
        inner = self.member_inner()
        return {**inner, "train": member_train(inner["train"], self.member_steps)}

    @property
    def search_member_alone_min(self) -> float:
        """``member_alone_min`` of a search member at es.member_steps: from the measured step time where one is given
        (member_steps x step_time_s + overhead_min), else member_time_min scaled by member_steps / train.steps."""
        full, steps = self.member_alone_min, self.longest_search_member_steps  # an online searcher's: a truncation
        if steps >= self.full_steps:
            return full
        if self.resources.get("step_time_s") is not None:
            return steps_minutes(steps, float(self.resources["step_time_s"]),
                                 float(self.resources.get("overhead_min") or 0.0))
        return full * steps / max(1, self.full_steps)

    @property
    def longest_search_member_steps(self) -> int:
        """The most steps one search member trains: es.member_steps, or an online searcher's longest truncation."""
        from meta.searchers import searcher_class

        bound = searcher_class(str(self.es.get("name", ""))).longest_member_steps(self.es)
        return self.member_steps if bound is None else int(bound)

    @property
    def search_timeout_s(self) -> float:
        """inner.timeout_s of a search member: the whole run's limit scaled to the longest search member's expected
        time where a measured step time gives it (steps x resources.step_time_s + overhead_min), so that a hung
        100-step member does not hold its GPU (and its SLURM array task does not ask for) a 1,600-step run's hours.
        Without a measured step time the whole run's limit stays: a member's fixed cost (model load, validation)
        cannot be told from its steps, and a healthy short member must never be cut."""
        steps, step_s = self.longest_search_member_steps, self.resources.get("step_time_s")
        if steps >= self.full_steps or step_s is None or self.member_alone_min <= 0:
            return self.inner_timeout_s
        short = steps_minutes(steps, float(step_s), float(self.resources.get("overhead_min") or 0.0))
        return float(math.ceil(self.inner_timeout_s * min(1.0, short / self.member_alone_min)))

    @property
    def member_alone_min(self) -> float:
        """A member's expected running time alone on its GPU, minutes: resources.member_time_min (derived from the
        measured step time where one is given), else its time limit, inner.timeout_s."""
        return float(self.resources.get("member_time_min") or self.inner_timeout_s / 60.0)

    @property
    def generation_shape(self) -> "GenerationShape":
        """One generation's members, control member, jobs, quorum count and early-stop capacity: the one count the
        plan, the orchestrator, the quorum, early stopping and the live view share (meta/search/generation_shape.py)."""
        from meta.search.generation_shape import GenerationShape

        return GenerationShape.build(self.population, self.es, self.control_member, self.quorum)

    @property
    def searcher_online(self) -> bool:
        """Whether the searcher trains truncations of its particles' runs (es=nres), not whole runs."""
        return _online(self.es)

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


def config_hash(raw: Mapping[str, Any], keys: Sequence[str] = SEARCH_KEYS) -> str:
    """Hash of the keys that define what a run computes (provenance for exported inits and presets): a search's
    SEARCH_KEYS by default, a tuning study's own (meta/tune/config.py STUDY_KEYS)."""
    from meta.searchers.radius import with_radius_renamed

    raw = with_radius_renamed(raw)  # a run stored under a former radius key hashes as under es.radius
    picked = plain({key: _get_dotted(raw, key) for key in keys})
    for key, default in ADDED_SEARCH_KEYS.items():
        *parents, leaf = key.split(".")
        node = picked
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] in (None, default):
            del node[leaf]
    for key in HOUSEKEEPING_KEYS:
        *parents, leaf = key.split(".")
        node = picked
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _get_dotted(raw: Mapping[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _int(raw: Mapping[str, Any], key: str, minimum: int) -> int:
    value = _get_dotted(raw, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum} (e.g. {key}={max(minimum, 2)})")
    return value


def _float(raw: Mapping[str, Any], key: str, low: float = -math.inf, high: float = math.inf) -> float:
    value = _get_dotted(raw, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} must be a finite number")
    if not low <= value <= high:
        raise ConfigError(f"{key}={value!r} must be between {low} and {high}")
    return float(value)


def _bool(raw: Mapping[str, Any], key: str) -> bool:
    value = _get_dotted(raw, key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be true or false")
    return value


# ------------------------------------------------------------------ time budget and resources
def derive_member_time(raw: MutableMapping[str, Any]) -> None:
    """Fill ``resources.member_time_min: null`` from a measured step time, in place: train.steps x
    resources.step_time_s + resources.overhead_min (model load, checkpoints, validations), rounded up. So the
    time budget of a preset follows its measurement, and a command-line ``train.steps`` moves it along."""
    resources = raw.get("resources")
    if not isinstance(resources, MutableMapping) or resources.get("member_time_min") is not None:
        return
    if resources.get("step_time_s") is None:
        raise ConfigError("resources.member_time_min is null and resources.step_time_s is not set: give the time of "
                          "one member in minutes (resources.member_time_min=360) or a measured step time "
                          "(resources.step_time_s=15.0, with resources.step_time_source saying where it was measured)")
    step_s = _float(raw, "resources.step_time_s", 1e-6)
    overhead = _float(raw, "resources.overhead_min", 0.0) if resources.get("overhead_min") is not None else 0.0
    resources["member_time_min"] = steps_minutes(_int(raw, "train.steps", 0), step_s, overhead)


def steps_minutes(steps: int, step_s: float, overhead_min: float) -> float:
    """A member's minutes from a measured step time: steps x step_s / 60 + overhead_min, rounded up."""
    return float(math.ceil(steps * step_s / 60.0 + overhead_min))


def member_time_text(resources: Mapping[str, Any], steps: Any, steps_key: str = "train.steps") -> str:
    """Where the expected time per member comes from, for the plans: the preset's minutes, or its measured step
    time and the source of that figure (resources.step_time_source); ``steps_key`` names where ``steps`` is set."""
    step_s = resources.get("step_time_s")
    if step_s is None:
        return ("resources.member_time_min" if steps_key == "train.steps" else
                f"resources.member_time_min x {steps_key}={steps} / train.steps")
    source = resources.get("step_time_source") or "no source given (resources.step_time_source)"
    return (f"resources.step_time_s={step_s:g} s/step x {steps_key}={steps} + resources.overhead_min="
            f"{resources.get('overhead_min') or 0:g} min; step time measured: {source}")


def member_sharing(raw: Mapping[str, Any]) -> GpuSharing:
    """How many members share one GPU and how much slower each runs (core/gpu_time.py), checked up front by
    every command that composes a config: ConfigError naming the key, before anything is written."""
    resources = raw.get("resources")
    try:
        return gpu_sharing(resources if isinstance(resources, Mapping) else {})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def derive_inner_timeout(raw: MutableMapping[str, Any]) -> None:
    """Fill ``inner.timeout_s: null`` from the preset's time per member (member_time_min x 60 x
    timeout_factor; x the measured slowdown when members share a GPU), in place, so that the stored config says the
    number the members ran under."""
    inner = raw.get("inner")
    if not isinstance(inner, MutableMapping) or inner.get("timeout_s") is not None:
        return
    minutes = member_sharing(raw).member_time(_float(raw, "resources.member_time_min", 1e-3))
    factor = _float(raw, "resources.timeout_factor", 1.0)
    seeds = raw.get("seeds_per_member") or 1  # a member trains its seeds one after another
    inner["timeout_s"] = float(math.ceil(minutes * 60.0 * factor * (seeds if isinstance(seeds, int) else 1)))


def _check_resources(raw: Mapping[str, Any], launcher: Mapping[str, Any], inner_timeout_s: float) -> None:
    """Cross-node checks a single node cannot make: a member needs the CPUs its threads use, and a SLURM
    member must be able to finish within its requeues. Launchers without these keys (local, debug) skip them."""
    threads = _get_dotted(raw, "train.num_threads")
    cpus = launcher.get("cpus_per_task")
    if isinstance(cpus, int) and isinstance(threads, int) and not isinstance(cpus, bool) and cpus < threads:
        raise ConfigError(
            f"launcher.cpus_per_task={cpus} is smaller than train.num_threads={threads}: the member's torch threads "
            f"would share {cpus} core(s). Set launcher.cpus_per_task={threads} (or resources.cpus), or lower "
            "train.num_threads"
        )
    time_min, requeues = launcher.get("time_min"), launcher.get("requeues")
    if isinstance(time_min, int) and isinstance(requeues, int) and time_min > 0 and requeues >= 0:
        reachable_s = (requeues + 1) * time_min * 60
        if reachable_s < inner_timeout_s:
            need = math.ceil(inner_timeout_s / (time_min * 60)) - 1
            raise ConfigError(
                f"a member could never finish: (launcher.requeues={requeues} + 1) x launcher.time_min={time_min} min "
                f"= {reachable_s / 3600:.2f} h of running time is less than inner.timeout_s={inner_timeout_s:g} s "
                f"({inner_timeout_s / 3600:.2f} h). Raise launcher.requeues to {need} or launcher.time_min to "
                f"{math.ceil(inner_timeout_s / 60 / (requeues + 1))}, or set launcher.time_min=null (one run of "
                "inner.timeout_s + kill_grace_s)"
            )


# ------------------------------------------------------------------ absolute paths
# Keys holding a filesystem path. A run records them absolute (resolved against the directory the user ran
# in), so that a resume from another directory, and every member on every node, reads the same files.
PATH_KEYS = ("run_dir", "init", "task.train_file", "task.test_file", "task.problems_file", "divergence.init",
             "model.gguf_file", "model.name_or_path", "stage.cache_dir")
# Values of these keys that are names, not paths.
_NOT_PATHS = {"init": ("uniform", "gaussian")}


def absolute_path(value: str, cwd: str | Path) -> str:
    """``value`` (``~`` expanded) made absolute against ``cwd``, normalised but with symlinks kept."""
    return os.path.normpath(os.path.join(str(cwd), os.path.expanduser(value)))


def _absolute_value(key: str, value: Any, cwd: str | Path) -> Any:
    if not isinstance(value, str) or not value or value in _NOT_PATHS.get(key, ()):
        return value
    if key == "model.name_or_path":  # a hub id ("Qwen/Qwen3-1.7B") is not a path: only local ones change
        local = value.startswith((".", "~", os.sep)) or os.path.exists(os.path.join(str(cwd), value))
        if not local:
            return value
    return absolute_path(value, cwd)


def absolute_paths(raw: MutableMapping[str, Any], cwd: str | Path) -> None:
    """Make every PATH_KEYS value of the resolved config absolute (in place)."""
    for key in PATH_KEYS:
        *parents, leaf = key.split(".")
        node: Any = raw
        for part in parents:
            node = node.get(part) if isinstance(node, MutableMapping) else None
        if isinstance(node, MutableMapping) and leaf in node:
            node[leaf] = _absolute_value(key, node[leaf], cwd)


def absolute_overrides(overrides: Sequence[str], cwd: str | Path) -> list[str]:
    """Command-line overrides with path values made absolute: they are recorded and replayed on resume,
    possibly from another directory, where a relative path would name another file."""
    result = []
    for override in overrides:
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in PATH_KEYS:
            override = f"{key}={_absolute_value(bare, value, cwd)}"
        result.append(override)
    return result


def build_search_config(raw: Mapping[str, Any]) -> SearchConfig:
    """Validate the resolved config (a plain dict) into a SearchConfig; ConfigError on the first problem."""
    from meta.searchers.radius import with_radius_renamed

    raw = with_radius_renamed(raw)  # a run dir's config stored before es.radius (meta.reevaluate, meta.export read it)
    for node in ("es", "launcher", "inner", *INNER_NODES):
        if not isinstance(raw.get(node), Mapping):
            raise ConfigError(f"config node {node!r} is missing; check conf/config.yaml's defaults list")
    population = _int(raw, "population", 2)
    cfg = SearchConfig(
        population=population,
        generations=_int(raw, "generations", 1),
        seed=_int(raw, "seed", 0),
        run_dir=str(raw.get("run_dir") or ""),
        es=searcher_settings(raw["es"]),
        launcher=dict(raw["launcher"]),
        inner_entrypoint=str(_get_dotted(raw, "inner.entrypoint") or ""),
        inner_timeout_s=_float(raw, "inner.timeout_s", 1e-3),
        inner_options=dict(_get_dotted(raw, "inner.options") or {}),
        inner_config={node: raw[node] for node in INNER_NODES},
        init=str(raw.get("init", "uniform")),
        fitness_on_failure=_float(raw, "fitness_on_failure"),
        max_failed_fraction=_float(raw, "max_failed_fraction", 0.0, 1.0),
        retries=_int(raw, "retries", 0),
        common_random_numbers=bool(raw.get("common_random_numbers", True)),
        log_level=str(raw.get("log_level", "INFO")).upper(),
        dry_run=_bool(raw, "dry_run"),
        resources=dict(raw.get("resources") or {}),
        control_member=_bool(raw, "control_member") if "control_member" in raw else True,
        quorum=_float(raw, "quorum", 0.0, 1.0) if "quorum" in raw else 1.0,
        straggler_grace=_float(raw, "straggler_grace", 0.0) if "straggler_grace" in raw else 0.5,
        reevaluate=_reevaluate(raw),
        seeds_per_member=_int(raw, "seeds_per_member", 1) if "seeds_per_member" in raw else 1,
        member_steps=member_steps_of(raw),
    )
    if cfg.quorum <= 0.0:
        raise ConfigError(f"quorum={cfg.quorum} must be above 0 (a fraction of the population, 1.0: wait for all)")
    if cfg.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level={cfg.log_level!r} must be one of DEBUG, INFO, WARNING, ERROR")
    _check_search_components(cfg)
    if cfg.searcher_online and cfg.member_steps != cfg.full_steps:
        raise ConfigError(f"es.{MEMBER_STEPS_KEY}={cfg.member_steps} does not apply to es={cfg.es.get('name')}: its "
                          f"particles train the whole train.steps={cfg.full_steps}, a truncation at a time "
                          f"(es.truncation_steps); set es.{MEMBER_STEPS_KEY}=null")
    if cfg.searcher_online and cfg.seeds_per_member > 1:
        raise ConfigError(f"seeds_per_member={cfg.seeds_per_member} does not apply to es={cfg.es.get('name')}: a "
                          "particle is one training run with one checkpoint; set seeds_per_member=1 (a larger "
                          "population averages more runs)")
    try:
        cfg.early_stop = EarlyStopConfig.from_mapping(raw.get("early_stop"))
        cfg.early_stop_step = check_early_stop(cfg.early_stop, cfg.es, member_train(raw["train"], cfg.member_steps),
                                               cfg.generation_shape)
    except EarlyStopError as exc:
        raise ConfigError(str(exc)) from None
    check_member_launch(raw, cfg.launcher, cfg.inner_timeout_s, cfg.inner_entrypoint, cfg.member_inner(),
                        cfg.resources)
    return cfg


def _names(raw: Mapping[str, Any], key: str, known: Sequence[str] | None) -> tuple[str, ...]:
    value = _get_dotted(raw, key)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}={value!r} must be a list of names, e.g. {key}=[{', '.join(known or ['humaneval'])}]")
    unknown = [v for v in value if known is not None and v not in known]
    if unknown:
        raise ConfigError(f"{key}: {unknown[0]!r} is not one of {', '.join(known or ())}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{key}={list(value)} names a row twice")
    return tuple(value)


def _baselines(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """reevaluate.baselines: known rows, or ``<row>@<preset file>`` with an existing file (meta/after/baselines.py reads
    it); the untrained model has no training settings to take from a preset."""
    key = "reevaluate.baselines"
    value = _get_dotted(raw, key)
    known = baselines()
    if value is None:
        return known
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}={value!r} must be a list of rows or null (every row), e.g. "
                          f"{key}=[{', '.join(known)}]")
    names = _names(raw, key, None)
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


def _reevaluate(raw: Mapping[str, Any]) -> ReevaluateConfig:
    node = raw.get("reevaluate")
    defaults = ReevaluateConfig()
    if node is None:
        return defaults
    if not isinstance(node, Mapping):
        raise ConfigError(f"reevaluate={node!r} must be a mapping {{top_k: 3, seeds: 3, report_seeds: 3, ...}}")
    try:
        refuse_unknown_keys(node, ReevaluateConfig.__dataclass_fields__, "reevaluate")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    top_k = _int(raw, "reevaluate.top_k", 0) if "top_k" in node else defaults.top_k
    seeds = _int(raw, "reevaluate.seeds", 1) if "seeds" in node else defaults.seeds
    report_seeds = _int(raw, "reevaluate.report_seeds", 0) if "report_seeds" in node else defaults.report_seeds
    if top_k and seeds < 2:
        raise ConfigError(f"reevaluate.seeds={seeds} gives no spread to compare inits by; use 2 or more "
                          "(or reevaluate.top_k=0 to skip re-evaluation)")
    if top_k and report_seeds == 1:
        raise ConfigError("reevaluate.report_seeds=1 gives no interval; use 2 or more (3+ for a useful one), "
                          "or 0 to skip the result table")
    transfer = _names(raw, "reevaluate.transfer", None) if "transfer" in node else defaults.transfer
    missing = [t for t in transfer if group_file(CONF_DIR, "task", t) is None]
    if missing:
        raise ConfigError(f"reevaluate.transfer: {missing[0]!r} is not a task (conf/task/{missing[0]}.yaml)")
    return ReevaluateConfig(
        top_k=top_k, seeds=seeds, report_seeds=report_seeds,
        baselines=_baselines(raw) if "baselines" in node else defaults.baselines,
        transfer=transfer, test=_bool(raw, "reevaluate.test") if "test" in node else defaults.test)


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
