"""The ``model`` node: which policy to train and how (dtype, numerics, the tiny model's shape, warm-up, LoRA).

Why beside the model registry, not in inner_loop/config.py: the loaders here read it, and the run config reads it as
its ``model`` node; with the node in models/ the arrow runs one way (config -> models), as the divergence's config
classes live with the divergence registry. It imports the registry, the pinned numerics' modes and core alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config.typed_nodes import one_of
from inner_loop.models.registry import model_entry, models
from inner_loop.process.pinned import NUMERICS_MODES

DTYPES = ("float32", "bfloat16", "float16")
#: what the warm-up's band is read on (ModelConfig.warmup_signal)
WARMUP_SIGNALS = ("sampled", "greedy")


@dataclass
class ModelConfig:
    """Which policy to train; `tiny` is built in code, the others load weights from a path, hub id or GGUF. The
    schema of the model group: every registered model's YAML composes on it (``model/<name>_schema``, with its name
    set: inner_loop.config.register_schemas), so each field here is the one home of its key's type and default."""

    name: str = "tiny"
    name_or_path: str | None = None
    gguf_file: str | None = None
    dtype: str = "float32"
    chat_template: bool = False
    #: extra variables for the chat template (e.g. {enable_thinking: false} for Qwen3, whose template otherwise
    #: opens a <think> block that a short completion never closes); used by training and evaluation alike.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    #: native: this machine's CPU kernels; pinned: the settings of inner_loop/process/pinned.py, which give the same
    #: numbers on every x86-64 CPU with AVX2 (one thread; the member and its warm-up run in a process started
    #: with them). The tiny model's preset pins; GPU presets stay native.
    cpu_numerics: str = "native"
    # tiny architecture (ignored for loaded models)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    # supervised format warm-up of the tiny model on task demonstrations, run until the probe's pass@1 (warmup_signal)
    # on problems held out of the training split enters warmup_band (checked every warmup_check_every steps); 0 max
    # steps = none
    warmup_max_steps: int = 0
    warmup_band: list[float] = field(default_factory=lambda: [0.30, 0.40])
    #: what the band is read on: ``sampled`` (pass@1 of temperature-1 samples with a fixed seed, the reward RL sees;
    #: smooth in the weights) or ``greedy`` (greedy pass@1, which jumps by +-0.2 between checks mid-learning)
    warmup_signal: str = "sampled"
    warmup_check_every: int = 25
    warmup_probe_size: int = 400
    warmup_lr: float = 1e-3
    warmup_batch_size: int = 64
    # LoRA (r = 0: full fine-tuning)
    lora_r: int = 0
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def validate(self) -> None:
        entry = model_entry(self.name)
        if entry is None and not self.name_or_path:
            raise ValueError(
                f"model.name={self.name!r} is not one of {list(models())} (conf/model/*.yaml); for any other model "
                "set model.name=hub and model.name_or_path=<hub id or local directory>"
            )
        if entry is not None and entry.needs_path and not self.name_or_path:
            raise ValueError(f"model.name={self.name} needs model.name_or_path (a hub id or a local model directory)")
        one_of("model.dtype", self.dtype, DTYPES)
        one_of("model.cpu_numerics", self.cpu_numerics, NUMERICS_MODES)
        if self.chat_template_kwargs and not self.chat_template:
            raise ValueError(
                f"model.chat_template_kwargs={self.chat_template_kwargs!r} has no effect with model.chat_template=false;"
                " set model.chat_template=true or drop the kwargs"
            )
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads")
        if self.warmup_max_steps < 0 or self.lora_r < 0:
            raise ValueError("model.warmup_max_steps and model.lora_r must be >= 0")
        if self.warmup_max_steps:
            self._validate_warmup()

    def _validate_warmup(self) -> None:
        band = self.warmup_band
        if not (len(band) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in band)
                and 0.0 <= band[0] <= band[1] <= 1.0):
            raise ValueError(f"model.warmup_band={band!r} must be [low, high] with 0 <= low <= high <= 1 "
                             f"(model.warmup_signal={self.warmup_signal} pass@1 on the warm-up probe at which the "
                             "warm-up stops)")
        one_of("model.warmup_signal", self.warmup_signal, WARMUP_SIGNALS)
        for key in ("warmup_check_every", "warmup_probe_size", "warmup_batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.warmup_lr <= 0:
            raise ValueError(f"model.warmup_lr must be > 0, got {self.warmup_lr}")
