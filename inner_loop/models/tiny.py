"""The tiny model: a character-level tokenizer and a small Llama-style causal LM, both built in code.

It is what tests, benchmarks and the laptop default train (no download, seconds on a CPU), so it must come out
bit-identical on every machine from its config and seed; its directory lives in the model cache.
"""
from __future__ import annotations

from pathlib import Path

import torch

from inner_loop.models.model_config import ModelConfig
from inner_loop.models.cache import build_once, cache_root, config_digest

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII (space..tilde) plus newline and tab: what task prompts and answers are made of.
TINY_CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")
_TINY_ARCH_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings", "seed")
#: Part of the tiny model's cache key: bump when the way it is built changes (2: CPU-independent float64 init).
TINY_BUILD_VERSION = 2


def build_tiny_tokenizer():
    """Character-level tokenizer over printable ASCII with pad/bos/eos/unk, built in code (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TINY_CHARS)}
    # BPE without merges splits every string into its characters; Fuse joins them back without separators.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(cfg: ModelConfig, vocab_size: int, tokenizer) -> torch.nn.Module:
    """A small Llama-style causal LM, deterministic from ``cfg.seed``."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    generator_state = torch.random.get_rng_state()
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    _initialise_independent_of_cpu(model, config.initializer_range, tokenizer.pad_token_id, cfg.seed)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id
    )
    return model


def _initialise_independent_of_cpu(model: torch.nn.Module, std: float, pad_id: int, seed: int) -> None:
    """Re-draw every weight matrix from N(0, std^2) in float64 and round to the model's dtype.

    torch's float32 ``normal_`` uses a vectorised kernel on AVX2/AVX-512 CPUs and a scalar one otherwise, so
    the same seed gave different tiny models on different machines; float64 draws take one code path everywhere.
    Norm weights keep their init (ones); the padding row of the embedding is zero, as in transformers' own init.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, param in model.named_parameters():
            if param.dim() >= 2:
                draw = torch.randn(param.shape, generator=generator, dtype=torch.float64) * std
                param.copy_(draw.to(param.dtype))
        model.get_input_embeddings().weight[pad_id].zero_()


def tiny_model_dir(cfg: ModelConfig, root: Path | None = None) -> Path:
    """The cached directory of the (un-warmed) tiny model for this architecture and seed, built on first use."""
    arch = {k: getattr(cfg, k) for k in _TINY_ARCH_KEYS} | {"build_version": TINY_BUILD_VERSION}
    final = (root or cache_root()) / "models" / f"tiny-{config_digest(arch)}"

    def build(tmp: Path) -> None:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(cfg, len(tokenizer), tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return build_once(final, build)
