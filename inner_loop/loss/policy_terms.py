"""Policy-gradient terms ("hosts"): functions (PolicyInputs, PolicyParams) -> PolicyOutput.

The regularizer and the aggregation are shared by every host, so a new trust-region variant only adds one
function and one entry in `inner_loop.loss.policy_registry`; the trainer never changes. The GRPO-family hosts
(token clipping, GSPO) live here; the trust-region hosts in `inner_loop.loss.trust_regions`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import torch

from core.keys import CLIP_RATIO_PREFIX


@dataclass
class PolicyInputs:
    """Per-token tensors of one batch, all (B, T) except advantages (B,)."""

    logps: torch.Tensor  # log pi_theta(y_t), with gradient
    old_logps: torch.Tensor  # log pi_old(y_t), the behaviour policy, no gradient
    advantages: torch.Tensor  # (B,) one advantage per sequence
    mask: torch.Tensor  # 1 on completion tokens, 0 on padding


@dataclass
class PolicyParams:
    """Host hyper-parameters; `extra` carries the ones specific to later hosts (e.g. a DPPO delta)."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class PolicyOutput:
    """Per-token loss (B, T) to be aggregated, plus detached scalar metrics for logging."""

    per_token_loss: torch.Tensor
    metrics: dict[str, float]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, params: PolicyParams) -> tuple[torch.Tensor, ...]:
    clipped = torch.clamp(ratio, 1.0 - params.epsilon_low, 1.0 + params.epsilon_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    low = (ratio < 1.0 - params.epsilon_low) & (adv < 0)
    high = (ratio > 1.0 + params.epsilon_high) & (adv > 0)
    return loss, low, high


def clip_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """PPO/GRPO token-ratio clipping: -min(c_t A, clip(c_t, 1-eps_low, 1+eps_high) A), c_t = pi/pi_old."""
    ratio = torch.exp(inputs.logps - inputs.old_logps)
    adv = inputs.advantages.unsqueeze(1)
    loss, low, high = _clipped_surrogate(ratio, adv, params)
    metrics = {
        f"{CLIP_RATIO_PREFIX}low": _masked_mean(low.float(), inputs.mask),
        f"{CLIP_RATIO_PREFIX}high": _masked_mean(high.float(), inputs.mask),
    }
    return PolicyOutput(loss, metrics)


def gspo_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """GSPO: the sequence ratio s_i = exp(mean_t log(pi/pi_old)) replaces the token ratio, broadcast per token.

    Every token of a sequence carries the same loss value, so `grpo` aggregation gives exactly the GSPO paper's
    per-sequence objective; the other aggregations weight sequences by their length.
    """
    mask = inputs.mask
    log_ratio = (inputs.logps - inputs.old_logps) * mask
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1.0)
    ratio = torch.exp(seq_log_ratio).unsqueeze(1)
    adv = inputs.advantages.unsqueeze(1)
    loss, low, high = _clipped_surrogate(ratio, adv, params)
    per_token = loss.expand_as(inputs.logps)
    metrics = {f"{CLIP_RATIO_PREFIX}low": float(low.float().mean()),
               f"{CLIP_RATIO_PREFIX}high": float(high.float().mean())}
    return PolicyOutput(per_token, metrics)
