"""TRL's GRPOConfig for one member: our typed keys plus the `train.trl` pass-through, built by ONE function.

Why one function for the member and for the up-front check: a value TRL rejects (``train.lr_scheduler=cosin``, a
``train.trl`` field of the wrong kind, a batch TRL cannot split into prompt groups) must stop the orchestrator
before anything is submitted, not fail identically in 180 members. The check builds the very GRPOConfig a member
builds, from the same code, so the two cannot drift apart.

`train.trl` reaches every GRPOConfig field (vLLM generation, continuous batching, gradient accumulation, mixed
precision, ``generation_kwargs``, ...) except those we set from typed keys; grpo/trl_overrides.py
checks it. Which field each of our keys sets is written once, in ``GRPO_FIELDS``: the keywords are built from it
and a rejected value is traced back to its key through it.
"""
from __future__ import annotations

import functools
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inner_loop.grpo.trl_overrides import trl_version

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


@dataclass(frozen=True)
class GrpoField:
    """The GRPOConfig field one of our keys sets, and how: ``derive`` turns the key's value into the field's
    (None: the value as it is)."""

    name: str
    derive: Callable[[Any, _Build], Any] | None = None


#: Our dotted key -> the GRPOConfig field it sets: the one table of that mapping. grpo_kwargs builds the keywords
#: from it, and an error TRL raises names its culprit through it, so the two cannot name different keys.
GRPO_FIELDS: dict[str, GrpoField] = {
    "train.steps": GrpoField("max_steps"),
    # train.batch_size counts the completions of one optimizer step; with gradient accumulation a micro-batch
    # holds batch_size / k of them
    "train.batch_size": GrpoField("per_device_train_batch_size", lambda size, build: size // build.accumulation),
    "train.group_size": GrpoField("num_generations"),
    "train.num_iterations": GrpoField("num_iterations"),
    "train.learning_rate": GrpoField("learning_rate"),
    "train.lr_scheduler": GrpoField("lr_scheduler_type"),
    "train.lr_warmup_steps": GrpoField("warmup_steps"),
    "train.weight_decay": GrpoField("weight_decay"),
    "train.grad_clip": GrpoField("max_grad_norm"),
    "train.max_completion_length": GrpoField("max_completion_length"),
    "train.temperature": GrpoField("temperature"),
    "train.top_p": GrpoField("top_p"),
    "train.aggregation": GrpoField("loss_type"),
    "train.scale_rewards": GrpoField("scale_rewards", lambda scale, build: "group" if scale else "none"),
    "train.epsilon_low": GrpoField("epsilon"),
    "train.epsilon_high": GrpoField("epsilon_high"),
    "train.save_every": GrpoField("save_steps"),
    "train.save_total_limit": GrpoField(
        "save_total_limit", lambda limit, build: trainer_save_total_limit(build.cfg.train.keep_checkpoints, limit)),
    "train.logging_steps": GrpoField("logging_steps"),
    # tensorboard is our own callback (inner_loop/progress_log.py) writing into the member's work dir
    "train.report_to": GrpoField("report_to", lambda names, build: [n for n in names if n != "tensorboard"]),
    # bf16 only where the member trains on a GPU; train.trl.bf16 may still override it
    "model.dtype": GrpoField("bf16", lambda dtype, build: dtype == "bfloat16" and build.gpu_member),
}
#: GRPOConfig fields no key of ours sets: fixed by how mirror-es trains (refused in train.trl, see OWNED_FIELDS in
#: trl_overrides.py), or defaults a user may change through train.trl (gradient accumulation, tqdm, completions).
_FIXED: dict[str, Any] = {
    "beta": 0.0, "save_strategy": "steps", "remove_unused_columns": False, "gradient_accumulation_steps": 1,
    "disable_tqdm": True, "log_completions": False,
}

#: The up-front check's output_dir: never created (GRPOConfig only records the path).
_CHECK_OUTPUT_DIR = os.path.join(tempfile.gettempdir(), "mirror-es-grpo-config-check")


def trainer_save_total_limit(keep: str, save_total_limit: int | None) -> int | None:
    """The Trainer's ``save_total_limit`` for a policy: ``all`` keeps every checkpoint, so no rotation."""
    return None if keep == "all" else save_total_limit


def grpo_kwargs(cfg: "InnerConfig", output_dir: str | Path, seed: int, use_cpu: bool,
                gpu_member: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The GRPOConfig keywords for ``cfg`` and, per keyword a user can change, the key it comes from.

    ``gpu_member``: whether the member trains on a GPU (decides the bf16 default for ``model.dtype=bfloat16``).
    """
    trl = dict(cfg.train.trl)
    build = _Build(cfg=cfg, gpu_member=gpu_member, accumulation=int(trl.get("gradient_accumulation_steps", 1)))
    kwargs: dict[str, Any] = {"output_dir": str(output_dir), "seed": seed, "data_seed": seed, "use_cpu": use_cpu,
                              **_FIXED}
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
                return _construct(kwargs)
        return _construct(kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever GRPOConfig raises is a configuration mistake
        culprits = _culprits(kwargs, sources)
        where = " or ".join(culprits) if culprits else (
            "the train settings (the keys that reach it: " + ", ".join(dict.fromkeys(sources.values())) + ")")
        raise ValueError(f"{where}: rejected by TRL's GRPOConfig (trl {trl_version()}): "
                         f"{type(exc).__name__}: {exc}") from exc


def check_grpo_config(cfg: "InnerConfig") -> None:
    """The up-front check: build the member's GRPOConfig (ValueError naming the key if TRL rejects it)."""
    build_grpo_config(cfg, _CHECK_OUTPUT_DIR, cfg.seed, check_only=True)
