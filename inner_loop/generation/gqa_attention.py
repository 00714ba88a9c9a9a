"""Grouped-query attention for the compiled decode step, without a copy of the KV cache per token step.

Why: transformers' SDPA attention (``integrations/sdpa_attention.py``, 5.23) attends grouped-query heads three ways:
SDPA's own ``enable_gqa`` (taken only without a mask, which a static cache always has), ``pack_gqa`` (one query token,
taken only when *not* compiling), else ``repeat_kv``, which expands the keys and values of the whole cache to
[batch, heads, cache length, head dim] and copies them. The persistent compiled decode step is compiled, has a mask
and one query token, so it took the third way at every token step and layer: the cache read ``heads / kv heads``
times over and written once, where reading it once is the step's real work.

This function packs the step's one query token per head onto its key/value head instead, the way ``pack_gqa`` does
eagerly: the query [batch, heads, 1, head dim] becomes [batch, kv heads, group, head dim] (a view), SDPA attends it over
the cache as it is, and the output is unpacked. Every other call (the prefill, a model without grouped heads, a
position bias or paged cache) goes to transformers' SDPA function unchanged, so the two agree wherever both run.
Registered under :data:`GQA_DECODE_ATTENTION` with the mask SDPA uses; the persistent decoder switches a model to it
for the length of a generation only (:func:`decode_attention`), so training's forwards stay on plain SDPA.

Attention windows (:func:`attention_window`, the owned loop's ``train.decode_windows``): a one-token step attends over
the first ``window`` positions of the cache only, where the whole cache would be read otherwise. A step is compiled
(and captured) per window; the decoder picks the smallest window that holds every filled position, so a step early in
a completion reads a fraction of a cache sized for the longest prompt plus every new token.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

#: The name the attention function is registered under in transformers' attention interface (and its mask's).
GQA_DECODE_ATTENTION = "mirror_gqa_decode"
#: Cache positions a one-token step attends over (None: all); read when a step is traced, so each compiled step
#: holds its own (torch.compile guards on it).
_window: int | None = None


@contextmanager
def attention_window(window: int | None) -> Iterator[None]:
    """One-token steps traced or run inside the block attend over the cache's first ``window`` positions."""
    global _window
    previous, _window = _window, window
    try:
        yield
    finally:
        _window = previous


def gqa_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: the output [batch, query length, heads, head dim] and no weights.
    One query token with grouped heads: SDPA over the unexpanded cache; anything else: transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_length, head_dim = query.shape
    if _window is not None and q_length == 1 and _window < key.shape[2]:  # the filled part of the cache only
        key, value = key[:, :, :_window], value[:, :, :_window]
        if attention_mask is not None:
            attention_mask = attention_mask[..., :_window]
    if (groups == 1 or q_length != 1 or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads = key.shape[1]
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    if attention_mask is not None and attention_mask.shape[1] != 1:  # a per-head mask: grouped as the query is
        attention_mask = attention_mask.reshape(attention_mask.shape[0], kv_heads, heads // kv_heads, -1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False)
    return out.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the function and its mask (SDPA's) with transformers' library-wide interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_DECODE_ATTENTION, gqa_decode_attention)
    AttentionMaskInterface.register(GQA_DECODE_ATTENTION, sdpa_mask)


@contextmanager
def decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Attend with :func:`gqa_decode_attention` while the block runs, where the model attends with SDPA (the
    function agrees with it; an eager or flash model keeps its own); restored after, also on an error."""
    previous = getattr(getattr(model, "config", None), "_attn_implementation", None)
    settable = getattr(model, "_can_set_attn_implementation", None)  # a model built on the attention interface
    if previous != "sdpa" or settable is None or not settable():
        yield
        return
    register()
    model.set_attn_implementation(GQA_DECODE_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
