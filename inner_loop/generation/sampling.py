"""The importance-sampling ratio of vLLM's samples, compared on the distribution the sampler drew from.

Why: TRL's vLLM correction (``vllm_importance_sampling_correction``) divides the trainer's log-prob of each sampled
token, taken over the FULL vocabulary at the sampling temperature, by vLLM's ``processed_logprobs``, taken AFTER
top_k / top_p and renormalised over the tokens they keep. Under a preset with ``top_p < 1`` every kept token's
processed probability is its full probability divided by the nucleus' mass, so the ratio measured the truncation,
not a sampler mismatch (mean 0.28 in the SmolLM2 rehearsal, sequences outside the mask's bounds dropped), while HF
generate, sampling from the very same truncated distribution, corrected nothing: the two backends trained different
policies. Computed here on the same processed distribution (the trainer's logits through the same top_k and top_p),
the ratio is 1 where the sampler is the policy and corrects only what it exists for (the sampler's own numerics),
so both backends train the same policy: samples from the truncated policy, the policy gradient of its full
log-probs. The truncation itself follows transformers' ``TopKLogitsWarper`` / ``TopPLogitsWarper`` and vLLM's
``apply_top_k_top_p`` (top_k first; then the smallest tokens whose cumulative probability stays within ``1 - top_p``
removed, the most likely token always kept).
"""
from __future__ import annotations

import math

import torch


def truncated_logits(logits: torch.Tensor, top_p: float, top_k: int | None) -> torch.Tensor:
    """``logits`` (any leading shape, vocabulary last; already divided by the temperature) with the tokens top_k
    and top_p drop set to -inf, as the samplers do before they draw."""
    vocab = logits.size(-1)
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - top_p
        drop[..., -1] = False  # the most likely token stays
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def processed_logps(logits: torch.Tensor, tokens: torch.Tensor, top_p: float, top_k: int | None) -> torch.Tensor:
    """Log-probs of ``tokens`` (B, T) under the truncated, renormalised distribution of ``logits`` (B, T, V; at the
    sampling temperature): what vLLM reports as ``processed_logprobs``."""
    scores = truncated_logits(logits.float(), top_p, top_k)
    return torch.log_softmax(scores, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def importance_sampling_ratio(policy_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                              mode: str, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio (``_generate_and_score_completions``) from two (B, T) log-prob
    tensors: per token, or per sequence (summed log differences) for the ``sequence_*`` modes; ``*_truncate``
    clamps to [clip_min, clip_max], ``*_mask`` zeroes what lies outside. Tokens without a sampler log-prob (NaN)
    get ratio 1."""
    diff = torch.nan_to_num((policy_logps - sampler_logps) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"train.trl.vllm_importance_sampling_mode={mode!r} is not one of TRL's four modes")
