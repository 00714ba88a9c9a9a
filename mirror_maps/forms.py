"""Per-token divergences a GRPO loss can add: sampled-token Bregman forms, full-vocabulary form, KL estimators.

All functions return one value per position ([B, T]); the caller masks and aggregates.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.checkpoint import checkpoint

from mirror_maps.numerics import PROB_FLOOR, phi2
from mirror_maps.potentials import Potential

logger = logging.getLogger(__name__)

SAMPLED_FORMS = ("sampled", "sampled_is")
KL_ESTIMATORS = ("k1", "k2", "k3")
FULL_FORM_CHUNK_BYTES = 256 * 2**20
"""Default working-set budget of `full_divergence` on the CPU (less when its logits are smaller, below)."""
FULL_FORM_CUDA_CHUNK_BYTES = 2 * 2**30
"""Default working-set budget on a CUDA device (at 151,936: 883 rows a chunk, 9,500 of their
vocabulary entries a slice). Small pieces leave an H100 waiting on the neural map's kernel launches and host syncs (8 x 512
positions, forward, whole rows a chunk: 4.6 s at 6 rows, 0.68 s at 55, 0.37 s at 256); 2 GiB of work is below
half the two logit tensors at that size."""
_WORK_BYTES_PER_ENTRY = 256
"""Bytes of work per vocabulary entry while a slice's divergence is evaluated and differentiated: measured on the CPU
for the neural map at Qwen3's vocabulary, 72 B forward and 205 B forward + backward (float32)."""
_ROW_TENSORS = 4
"""Float tensors of a row's whole vocabulary alive while its slices are evaluated: the two log-softmaxes and, in the
backward, their gradients."""
_MIN_WORK_BYTES = 8 * 2**20
"""The least working set: smaller slices would cost more in calls than they save."""


def _check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has shape {list(a.shape)} but {name_b} has shape {list(b.shape)}; they must match")


def sampled_divergence(
    potential: Potential, logp: torch.Tensor, ref_logp: torch.Tensor, form: str = "sampled"
) -> torch.Tensor:
    """Bregman divergence of the sampled token's probabilities, per token.

    form="sampled": d(p_t, q_t) with p = exp(logp), q = exp(ref_logp) clamped at 1e-10 -- what the
    authors' code computes. form="sampled_is": d(p_t, q_t) / p_t, the single-sample estimate of the full
    form sum_v d(pi_v, ref_v) for tokens drawn from pi. The weight 1/p_t is detached: the sampling
    distribution is not differentiated, so E_y[grad d(p_y, q_y) / p_y] = sum_v d_p(pi_v, ref_v) grad pi_v,
    the gradient of the full form. Differentiating through 1/p_t would add -E[d grad p / p^2], a bias.
    """
    if form not in SAMPLED_FORMS:
        raise ValueError(f"form={form!r} is unknown; use one of {SAMPLED_FORMS} (or full_divergence for 'full')")
    _check_same_shape("logp", logp, "ref_logp", ref_logp)
    p = torch.exp(logp).clamp_min(PROB_FLOOR)
    q = torch.exp(ref_logp).clamp_min(PROB_FLOOR)
    divergence = potential.bregman(p, q)
    if form == "sampled_is":
        divergence = divergence / p.detach()
    return divergence


def _chunk_budget_bytes(device: torch.device) -> int:
    """Working-set bytes per chunk on `device`: cache-friendly on the CPU, launch-amortising on CUDA.

    Other device types keep the CPU value, since no measurement backs another choice for them.
    """
    return FULL_FORM_CUDA_CHUNK_BYTES if device.type == "cuda" else FULL_FORM_CHUNK_BYTES


def _work_bytes(flat: torch.Tensor) -> int:
    """The working set: the device's budget, but never more than the logits themselves take (at least
    _MIN_WORK_BYTES), so that the divergence costs a bounded multiple of its inputs at any size."""
    return min(_chunk_budget_bytes(flat.device), max(_MIN_WORK_BYTES, flat.numel() * flat.element_size()))


def _auto_chunk_size(vocab_size: int, element_size: int, budget: int) -> int:
    """Positions per chunk: as many whole rows (their log-softmaxes and gradients) as fit ``budget``, at least one."""
    return max(1, budget // (vocab_size * element_size * _ROW_TENSORS))


def _slice_divergence(potential: Potential, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return potential.bregman_from_logprobs(logp, logq).sum(dim=-1)


def _chunk_divergence(potential: Potential, logits: torch.Tensor, ref_logits: torch.Tensor,
                      columns: int) -> torch.Tensor:
    """The divergence of a chunk of rows, summed over the vocabulary ``columns`` entries at a time: the map's work
    per entry (``_WORK_BYTES_PER_ENTRY``) is bounded by a slice, not by the rows' whole vocabulary. Under autograd
    each slice is checkpointed too, so a chunk's backward holds one slice's work at a time."""
    logp = torch.log_softmax(logits, dim=-1)
    logq = torch.log_softmax(ref_logits, dim=-1)
    vocab = logp.shape[-1]
    if columns >= vocab:
        return _slice_divergence(potential, logp, logq)
    differentiable = torch.is_grad_enabled() and (logp.requires_grad or logq.requires_grad)
    total: torch.Tensor | None = None
    for start in range(0, vocab, columns):
        piece = (logp[:, start:start + columns], logq[:, start:start + columns])
        part = (checkpoint(_slice_divergence, potential, *piece, use_reentrant=False) if differentiable
                else _slice_divergence(potential, *piece))
        total = part if total is None else total + part
    assert total is not None
    return total


def full_divergence(
    potential: Potential, logits: torch.Tensor, ref_logits: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """sum over the vocabulary of d(softmax(logits), softmax(ref_logits)) at every position -> [B, T].

    Positions are processed `chunk_size` at a time, and each chunk's vocabulary in slices, both sized from a working
    budget (256 MiB on the CPU, 2 GiB on CUDA, at most the logits' own bytes), so peak memory is the two logit
    tensors plus one chunk's rows and one slice's work, never [B, T, V, 126] nor a whole row's work at Qwen3's
    vocabulary. Under autograd each chunk and slice is checkpointed (recomputed in backward) so the saved state
    stays one chunk too. The log-probabilities come from log_softmax in the logits' dtype; no 1e-10 clamp
    is applied here.
    """
    _check_same_shape("logits", logits, "ref_logits", ref_logits)
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape [..., V] with at least one position dim, got {list(logits.shape)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
    lead_shape = logits.shape[:-1]
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_ref = ref_logits.reshape(-1, vocab)
    budget = _work_bytes(flat)
    if chunk_size is None:
        chunk_size = _auto_chunk_size(vocab, flat.element_size(), budget)
    columns = max(1, budget // (_WORK_BYTES_PER_ENTRY * min(chunk_size, max(flat.shape[0], 1))))
    differentiable = torch.is_grad_enabled() and (flat.requires_grad or flat_ref.requires_grad)
    logger.debug("full_divergence: %d positions, vocabulary %d, chunk_size %d, %d entries a slice, checkpointed=%s",
                 flat.shape[0], vocab, chunk_size, columns, differentiable)
    pieces = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size]
        chunk_ref = flat_ref[start : start + chunk_size]
        if differentiable:
            pieces.append(checkpoint(_chunk_divergence, potential, chunk, chunk_ref, columns, use_reentrant=False))
        else:
            pieces.append(_chunk_divergence(potential, chunk, chunk_ref, columns))
    return torch.cat(pieces).reshape(lead_shape)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = -log r = logp - ref_logp with r = pi_ref / pi (unbiased, high variance, can be negative)."""
    _check_same_shape("logp", logp, "ref_logp", ref_logp)
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2 (biased, low variance, >= 0)."""
    _check_same_shape("logp", logp, "ref_logp", ref_logp)
    log_r = ref_logp - logp
    return 0.5 * log_r * log_r


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = r - 1 - log r (unbiased, >= 0), computed as (log r)^2 phi2(log r) so it does not cancel near r = 1."""
    _check_same_shape("logp", logp, "ref_logp", ref_logp)
    log_r = ref_logp - logp
    return log_r * log_r * phi2(log_r)


_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimator(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Sampled-token KL(pi || pi_ref) estimate per token, by name: "k1", "k2" or "k3" (docs/method.md §1)."""
    if estimator not in _ESTIMATORS:
        raise ValueError(f"estimator={estimator!r} is unknown; use one of {KL_ESTIMATORS}")
    return _ESTIMATORS[estimator](logp, ref_logp)
