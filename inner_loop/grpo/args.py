"""TRL's GRPOConfig for one member: our typed keys plus the `train.trl` pass-through, built by ONE function.

Why one function for the member and for the up-front check: a value TRL rejects (``train.lr_scheduler=cosin``, a
``train.trl`` field of the wrong kind, a batch TRL cannot split into prompt groups) must stop the orchestrator
before anything is submitted, not fail identically in 180 members. The check builds the very GRPOConfig a member
builds, from the same code, so the two cannot drift apart.

`train.trl` reaches every GRPOConfig field (vLLM generation, continuous batching, gradient accumulation, mixed
precision, ``generation_kwargs``, ...) except those we set from typed keys; trl_settings/trl_overrides.py
checks it. Which field each of our keys sets is written once, in trl_settings/fields.py's ``GRPO_FIELDS``: the keywords
are built from it, a rejected value is traced back to its key through it, and train.trl's refusals are read from it.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inner_loop.generation.vllm_colocate import share_vllm_memory
from inner_loop.trl_settings.fields import FIXED_FIELDS, GRPO_FIELDS
from inner_loop.trl_settings.trl_overrides import trl_version

if TYPE_CHECKING:  # the real imports are lazy: TRL takes seconds to import
    from trl import GRPOConfig

    from inner_loop.config import InnerConfig


@dataclass(frozen=True)
class _Build:
    """What a derived value may depend on besides its own key."""

    cfg: "InnerConfig"
    gpu_member: bool
    #: train.trl.gradient_accumulation_steps (1 unless passed through)
    accumulation: int


#: The up-front check's output_dir: never created (GRPOConfig only records the path).
_CHECK_OUTPUT_DIR = os.path.join(tempfile.gettempdir(), "mirror-es-grpo-config-check")


def grpo_kwargs(cfg: "InnerConfig", output_dir: str | Path, seed: int, use_cpu: bool,
                gpu_member: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The GRPOConfig keywords for ``cfg`` and, per keyword a user can change, the key it comes from.

    ``gpu_member``: whether the member trains on a GPU (decides the bf16 default for ``model.dtype=bfloat16``).
    """
    trl = dict(cfg.train.trl)
    build = _Build(cfg=cfg, gpu_member=gpu_member, accumulation=int(trl.get("gradient_accumulation_steps", 1)))
    kwargs: dict[str, Any] = {"output_dir": str(output_dir), "seed": seed, "data_seed": seed, "use_cpu": use_cpu,
                              **FIXED_FIELDS}
    sources: dict[str, str] = {}
    for key, target in GRPO_FIELDS.items():
        value = functools.reduce(getattr, key.split("."), cfg)
        kwargs[target.name] = value if target.derive is None else target.derive(value, build)
        sources[target.name] = key
    for key, value in trl.items():
        kwargs[key] = value
        sources[key] = f"train.trl.{key}"
    if build.accumulation != 1:
        sources[GRPO_FIELDS["train.batch_size"].name] = "train.batch_size / train.trl.gradient_accumulation_steps"
    return kwargs, sources


def _construct(kwargs: Mapping[str, Any]) -> "GRPOConfig":
    from trl import GRPOConfig

    return GRPOConfig(**kwargs)


def _culprits(kwargs: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """The keys whose value alone makes GRPOConfig fail: building without it (GRPOConfig's default instead)
    succeeds. ~2 ms a build, and only on the error path."""
    found = []
    for field_name, source in sources.items():
        if field_name == "use_cpu":  # never dropped: in the up-front check it keeps the build off the GPU
            continue
        trial = {k: v for k, v in kwargs.items() if k != field_name}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _construct(trial)
        except Exception:  # noqa: BLE001 - any failure means this key alone is not the cause
            continue
        found.append(source)
    return list(dict.fromkeys(found))


def build_grpo_config(cfg: "InnerConfig", output_dir: str | Path, seed: int, *,
                      check_only: bool = False) -> "GRPOConfig":
    """The GRPOConfig a member trains with; ValueError naming the key(s) if TRL's GRPOConfig rejects the settings.

    ``check_only``: build it the way the up-front check does, in a process that is not the member's: on the CPU
    (so an orchestrator on a GPU node never opens a CUDA context), as a GPU member would set bf16. GRPOConfig
    writes no file (``output_dir`` is only recorded) and loads no model.
    """
    if check_only:
        use_cpu, gpu_member = True, True
    else:
        import torch

        gpu_member = torch.cuda.is_available()
        use_cpu = not gpu_member
    kwargs, sources = grpo_kwargs(cfg, output_dir, seed, use_cpu=use_cpu, gpu_member=gpu_member)
    if check_only:
        kwargs["use_cpu"] = True  # even where train.trl.use_cpu=false: the member applies that on its own node
    try:
        if check_only:
            with warnings.catch_warnings():  # the member repeats GRPOConfig's own warnings where they matter
                warnings.simplefilter("ignore")
                args = _construct(kwargs)
        else:
            args = _construct(kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever GRPOConfig raises is a configuration mistake
        culprits = _culprits(kwargs, sources)
        where = " or ".join(culprits) if culprits else (
            "the train settings (the keys that reach it: " + ", ".join(dict.fromkeys(sources.values())) + ")")
        raise ValueError(f"{where}: rejected by TRL's GRPOConfig (trl {trl_version()}): "
                         f"{type(exc).__name__}: {exc}") from exc
    # a colocated vLLM engine's part of a shared card, refused here (and so up front) if it cannot fit the share
    share_vllm_memory(args, cfg.gpu_memory_fraction, cfg.members_per_gpu)
    return args


def check_grpo_config(cfg: "InnerConfig") -> None:
    """The up-front check: build the member's GRPOConfig (ValueError naming the key if TRL rejects it), and refuse
    vLLM generation where vLLM is not installed (TRL would fail only in each member, after loading the model)."""
    build_grpo_config(cfg, _CHECK_OUTPUT_DIR, cfg.seed, check_only=True)
    if cfg.train.trl.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        raise ValueError("train.trl.use_vllm=true, but vLLM is not installed in this environment: run "
                         "scripts/install_vllm.sh (members use the same environment)")
