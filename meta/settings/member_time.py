"""A member's expected running time and time limit, from the resources node: filled into the composed config (so the
stored config says the numbers the members ran under) and checked against the launcher before anything is submitted.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, MutableMapping

from meta.settings.schema import (ConfigError, Resources, checked_sharing, steps_minutes, train_steps,
                                  typed_config)
from core.config.dotted_keys import select_key
from core.gpu_time import GpuSharing


def _resources(raw: Mapping[str, Any]) -> Resources:
    """The resources node read through its schema (types and ranges checked, naming ``resources.<key>``)."""
    return typed_config(Resources, raw.get("resources") or {}, "resources")


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
    typed = _resources(raw)
    resources["member_time_min"] = steps_minutes(train_steps(raw), float(typed.step_time_s or 0.0), typed.overhead_min)


def member_time_text(resources: Mapping[str, Any], steps: Any, steps_key: str = "train.steps") -> str:
    """Where the expected time per member comes from, for the plans: the preset's minutes, or its measured step
    time and the source of that figure (resources.step_time_source); ``steps_key`` names where ``steps`` is set."""
    step_s = resources.get("step_time_s")
    if step_s is None:
        return ("resources.member_time_min" if steps_key == "train.steps" else
                f"resources.member_time_min x {steps_key}={steps} / train.steps")
    source = resources.get("step_time_source") or "no source given (resources.step_time_source)"
    # a member shorter than the whole run pays a short run's fixed minutes where the preset gives them
    key = short_run_overhead_key(resources) if steps_key != "train.steps" else "overhead_min"
    return (f"resources.step_time_s={step_s:g} s/step x {steps_key}={steps} + resources.{key}="
            f"{resources.get(key) or 0:g} min; step time measured: {source}")


def short_run_overhead_key(resources: Mapping[str, Any]) -> str:
    """The resources key a search member shorter than the run takes its fixed minutes from: short_run_overhead_min,
    or overhead_min where that is unset."""
    return "short_run_overhead_min" if resources.get("short_run_overhead_min") is not None else "overhead_min"


def member_sharing(raw: Mapping[str, Any]) -> GpuSharing:
    """How many members share one GPU and how much slower each runs (core/gpu_time.py), checked up front by
    every command that composes a config: ConfigError naming the key, before anything is written."""
    resources = raw.get("resources")
    return checked_sharing(resources if isinstance(resources, Mapping) else {})


def derive_inner_timeout(raw: MutableMapping[str, Any]) -> None:
    """Fill ``inner.timeout_s: null`` from the preset's time per member (member_time_min x 60 x
    timeout_factor; x the measured slowdown when members share a GPU), in place, so that the stored config says the
    number the members ran under."""
    inner = raw.get("inner")
    if not isinstance(inner, MutableMapping) or inner.get("timeout_s") is not None:
        return
    typed = _resources(raw)
    if typed.member_time_min is None:
        raise ConfigError("resources.member_time_min=None must be a number (minutes per member), or give "
                          "resources.step_time_s")
    minutes = member_sharing(raw).member_time(typed.member_time_min)
    seeds = raw.get("seeds_per_member") or 1  # a member trains its seeds one after another
    inner["timeout_s"] = float(math.ceil(minutes * 60.0 * typed.timeout_factor * (seeds if isinstance(seeds, int) else 1)))


def check_resources(raw: Mapping[str, Any], launcher: Mapping[str, Any], inner_timeout_s: float) -> None:
    """Cross-node checks a single node cannot make: a member needs the CPUs its threads use, and a SLURM
    member must be able to finish within its requeues. Launchers without these keys (local, debug) skip them."""
    threads = select_key(raw, "train.num_threads")
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
