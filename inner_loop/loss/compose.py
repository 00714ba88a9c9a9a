"""Aggregating per-token losses into a scalar and composing policy term + coefficient * regularizer.

Kept apart from the trainer so the exact formulas can be checked against hand computations on tiny tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inner_loop.loss.policy_registry import get_policy_term
from inner_loop.loss.policy_terms import PolicyInputs, PolicyParams


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, kind: str, max_completion_length: int) -> torch.Tensor:
    """Masked reduction of a (B, T) tensor.

    dr_grpo: sum / (B * max_completion_length) (no length bias); grpo: mean per sequence, then over sequences;
    bnpo: mean over all active tokens of the batch.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if kind == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_completion_length)
    if kind == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if kind == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    raise ValueError(f"train.aggregation={kind!r} is not one of ['dr_grpo', 'grpo', 'bnpo']")


@dataclass
class LossBreakdown:
    """The scalar to back-propagate, its two parts (with their graphs, for the gradient-share diagnostic) and
    detached floats for logging.

    ``loss == policy_term + regularizer_term`` (aggregation is linear); ``regularizer_term`` is the aggregated
    ``coef * D`` and None when there is no regularizer or its coefficient is 0.
    """

    loss: torch.Tensor
    policy_term: torch.Tensor
    regularizer_term: torch.Tensor | None
    policy_loss: float
    regularizer_value: float
    metrics: dict[str, float]


def compose_loss(
    inputs: PolicyInputs,
    params: PolicyParams,
    policy_term: str,
    regularizer: torch.Tensor | None,
    coef: float,
    aggregation: str,
    max_completion_length: int,
    policy_weight: torch.Tensor | None = None,
) -> LossBreakdown:
    """aggregate(policy_weight * policy_per_token + coef * D_per_token).

    ``policy_weight`` is TRL's vLLM importance-sampling ratio ((B, T) or (B, 1)) when generation ran in vLLM:
    it corrects the policy-gradient estimate for tokens sampled by vLLM's copy of the policy and, as in TRL
    (whose own KL term is added after this correction), it does not touch the regularizer, which compares the
    trained policy with the reference at the positions visited and needs no sampler correction in the full form.
    ``regularizer_value`` is the aggregated D, before the coefficient.
    """
    out = get_policy_term(policy_term)(inputs, params)
    policy_per_token = out.per_token_loss
    if policy_weight is not None:
        policy_per_token = policy_per_token * policy_weight
    policy_agg = aggregate(policy_per_token, inputs.mask, aggregation, max_completion_length)
    reg_value = 0.0
    reg_term = None
    if regularizer is not None:
        reg_agg = aggregate(regularizer, inputs.mask, aggregation, max_completion_length)
        reg_value = float(reg_agg.detach())
        if coef != 0.0:
            reg_term = coef * reg_agg
    loss = policy_agg if reg_term is None else policy_agg + reg_term
    return LossBreakdown(loss, policy_agg, reg_term, float(policy_agg.detach()), reg_value, out.metrics)
