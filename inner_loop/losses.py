"""Aggregating per-token losses into a scalar and composing policy term + coefficient * regularizer.

Kept apart from the trainer so the exact formulas can be checked against hand computations on tiny tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inner_loop.policy_registry import get_policy_term
from inner_loop.policy_terms import PolicyInputs, PolicyParams


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
    """The scalar to back-propagate and its parts (detached floats) for diagnostics."""

    loss: torch.Tensor
    policy_loss: float
    regularizer_value: float
    regularizer_share: float
    metrics: dict[str, float]


def compose_loss(
    inputs: PolicyInputs,
    params: PolicyParams,
    policy_term: str,
    regularizer: torch.Tensor | None,
    coef: float,
    aggregation: str,
    max_completion_length: int,
) -> LossBreakdown:
    """aggregate(policy_per_token + coef * D_per_token).

    ``regularizer_value`` is the aggregated D (before the coefficient); ``regularizer_share`` is
    |coef * D| / (|policy| + |coef * D|), which shows at a glance when the regularizer is inert (~0) or dominates.
    """
    out = get_policy_term(policy_term)(inputs, params)
    per_token = out.per_token_loss
    reg_value = 0.0
    share = 0.0
    policy_agg = aggregate(out.per_token_loss, inputs.mask, aggregation, max_completion_length)
    if regularizer is not None and coef != 0.0:
        per_token = per_token + coef * regularizer
        reg_agg = aggregate(regularizer.detach(), inputs.mask, aggregation, max_completion_length)
        reg_value = float(reg_agg)
        weighted = abs(coef * reg_value)
        denom = abs(float(policy_agg.detach())) + weighted
        share = weighted / denom if denom > 0 else 0.0
    elif regularizer is not None:
        reg_value = float(aggregate(regularizer.detach(), inputs.mask, aggregation, max_completion_length))
    loss = aggregate(per_token, inputs.mask, aggregation, max_completion_length)
    return LossBreakdown(loss, float(policy_agg.detach()), reg_value, share, out.metrics)
