"""The base policy: which weights (tiny, SmolLM2, Qwen3, any hub id or path), loaded from where, with which adapter.

Every model this returns is loaded from a directory or hub id: the built ones come from the model cache
(inner_loop/models/cache.py) so concurrent population members share one copy and TRL can reload the reference.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from inner_loop.config import ModelConfig
from inner_loop.models.smollm2 import smollm2_model_dir
from inner_loop.models.tiny import tiny_model_dir

QWEN3_1_7B = "Qwen/Qwen3-1.7B"


def resolve_model_dir(cfg: ModelConfig) -> str:
    """A local directory or hub id from which `from_pretrained` loads the base policy (warm-up excluded)."""
    if cfg.name_or_path:
        path = Path(cfg.name_or_path).expanduser()
        if (cfg.name_or_path.startswith((".", "/", "~")) or path.exists()) and not path.is_dir():
            raise ValueError(f"model.name_or_path={cfg.name_or_path!r}: no such model directory")
        return str(path) if path.is_dir() else cfg.name_or_path
    if cfg.name == "tiny":
        return str(tiny_model_dir(cfg))
    if cfg.name == "smollm2_135m":
        return str(smollm2_model_dir(cfg))
    if cfg.name == "qwen3_1_7b":
        return QWEN3_1_7B
    raise ValueError(f"model.name={cfg.name!r} needs model.name_or_path")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_policy(cfg: ModelConfig, path: str):
    """(model, tokenizer) from ``path``; with ``cfg.lora_r`` > 0 the model is wrapped in a fresh LoRA adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype))
    except OSError as exc:
        raise ValueError(
            f"could not load model {path!r} ({exc}); hub models need the weights in the local HF cache or network"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    return model, tokenizer


def model_summary(cfg: ModelConfig) -> dict:
    """The part of the model config that identifies the weights (for logs and manifests)."""
    return {k: v for k, v in asdict(cfg).items() if not k.startswith("lora") or cfg.lora_r > 0}
