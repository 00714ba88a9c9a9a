"""Trust-region policy terms from the related work: KL3 clipping, DPPO masks, SPO and DRPO (docs/method.md §4).

Each is a host for the policy half of the GBMPO loss, with the signature of the `policy_terms` registry. They
only differ from plain GRPO once the policy has moved away from the behaviour policy mu that sampled the
rollout, i.e. with several optimisation passes per generation batch (`train.num_iterations > 1`).

Notation: r = pi_theta(y_t) / mu(y_t), A = the sequence's advantage, pi and mu the sampled token's probabilities.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inner_loop.loss.policy_terms import PolicyInputs, PolicyOutput, PolicyParams
from core.keys import TRUST_REGION_PREFIX

#: Default trust-region sizes: the values the papers report (DRPO's stated 12.5 conflicts with its own
#: boundary pi* = mu +- delta, so ours is a plain configured value with a default inside (0, 1]).
DEFAULT_SIZES: dict[str, dict[str, float]] = {
    "kl3_clip": {"delta": 0.01},
    "dppo_tv": {"delta": 0.15},
    "dppo_kl": {"delta": 0.05},
    "spo": {"epsilon": 0.2},
    "drpo": {"delta": 0.5},
}


def trust_region_size(name: str, params: PolicyParams) -> dict[str, float]:
    """The host's size parameters from `params.extra` (falling back to the defaults), validated > 0."""
    sizes = dict(DEFAULT_SIZES[name])
    for key in sizes:
        if key in params.extra and params.extra[key] is not None:
            sizes[key] = float(params.extra[key])
        value = sizes[key]
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(
                f"train.policy_extra.{key}={value!r} is invalid for policy_loss={name!r}: it must be a finite "
                f"number > 0 (default {DEFAULT_SIZES[name][key]})"
            )
    return sizes


def lambert_w(z: float, branch: int = 0) -> float:
    """Real Lambert W on [-1/e, 0) for branch 0 (W >= -1) or branch -1 (W <= -1), by Halley iteration.

    Only needed once per configuration (for the KL3 ratio bounds), so a scalar float64 solver is enough.
    """
    if not -1.0 / math.e <= z < 0.0:
        raise ValueError(f"lambert_w is implemented for z in [-1/e, 0), got {z}")
    if branch not in (0, -1):
        raise ValueError(f"lambert_w branch must be 0 or -1, got {branch}")
    # Start from the branch-point expansion W ~ -1 +- sqrt(2 (1 + e z)), good near -1/e, then refine.
    root = math.sqrt(max(2.0 * (1.0 + math.e * z), 0.0))
    w = -1.0 + root if branch == 0 else -1.0 - root
    if branch == -1 and z > -0.25:
        w = math.log(-z) - math.log(-math.log(-z))
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - z
        if f == 0.0:
            break
        wp1 = w + 1.0
        if wp1 == 0.0:
            break
        step = f / (ew * wp1 - (w + 2.0) * f / (2.0 * wp1))
        w -= step
        if abs(step) <= 1e-15 * (1.0 + abs(w)):
            break
    return w


def kl3_ratio_bounds(delta: float) -> tuple[float, float]:
    """[l, u] with r - 1 - log r <= delta  <=>  l <= r <= u; from the two real branches of Lambert W."""
    z = -math.exp(-(1.0 + delta))
    return -lambert_w(z, 0), -lambert_w(z, -1)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x.float() * mask).sum() / mask.sum().clamp(min=1.0))


@dataclass
class _Common:
    ratio: torch.Tensor
    adv: torch.Tensor
    pi: torch.Tensor
    mu: torch.Tensor


def _common(inputs: PolicyInputs) -> _Common:
    ratio = torch.exp(inputs.logps - inputs.old_logps)
    return _Common(
        ratio=ratio,
        adv=inputs.advantages.unsqueeze(1).to(ratio.dtype),
        pi=torch.exp(inputs.logps.detach()),
        mu=torch.exp(inputs.old_logps.detach()),
    )


def _metrics(c: _Common, mask: torch.Tensor, affected: torch.Tensor, label: str) -> dict[str, float]:
    return {
        f"{TRUST_REGION_PREFIX}{label}_frac": _masked_mean(affected, mask),
        f"{TRUST_REGION_PREFIX}mean_ratio": _masked_mean(c.ratio.detach(), mask),
    }


def kl3_clip_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """PPO-style clipping of the ratio to the KL3 trust region {r - 1 - log r <= delta} (asymmetric bounds)."""
    (delta,) = trust_region_size("kl3_clip", params).values()
    low, high = kl3_ratio_bounds(delta)
    c = _common(inputs)
    clipped = torch.clamp(c.ratio, low, high)
    loss = -torch.minimum(c.ratio * c.adv, clipped * c.adv)
    active = ((c.ratio < low) & (c.adv < 0)) | ((c.ratio > high) & (c.adv > 0))
    return PolicyOutput(loss, _metrics(c, inputs.mask, active, "clipped"))


def _dppo(c: _Common, outside: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared DPPO body: -r A on kept tokens; a token is dropped when the update would push it further out."""
    raising = c.adv > 0  # a positive advantage pushes pi up, a non-positive one down
    drop = (raising & (c.pi > c.mu) & outside) | (~raising & (c.pi < c.mu) & outside)
    keep = (~drop).to(c.ratio.dtype)
    return -(keep * c.ratio * c.adv), drop


def dppo_tv_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """DPPO binary-TV mask: keep t if (A > 0 and pi - mu <= delta) or (A <= 0 and pi - mu >= -delta)."""
    (delta,) = trust_region_size("dppo_tv", params).values()
    c = _common(inputs)
    loss, drop = _dppo(c, (c.pi - c.mu).abs() > delta)
    return PolicyOutput(loss, _metrics(c, inputs.mask, drop, "masked"))


def binary_kl(mu: torch.Tensor, pi: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """KL(Bern(mu) || Bern(pi)): the divergence of the sampled token's two-outcome distributions."""
    mu = mu.clamp(eps, 1 - eps)
    pi = pi.clamp(eps, 1 - eps)
    return mu * (torch.log(mu) - torch.log(pi)) + (1 - mu) * (torch.log1p(-mu) - torch.log1p(-pi))


def dppo_kl_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """DPPO binary-KL mask: as the TV mask, with KL(Bern(mu) || Bern(pi)) > delta marking 'outside'."""
    (delta,) = trust_region_size("dppo_kl", params).values()
    c = _common(inputs)
    loss, drop = _dppo(c, binary_kl(c.mu, c.pi) > delta)
    return PolicyOutput(loss, _metrics(c, inputs.mask, drop, "masked"))


def spo_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """SPO: -(A r - |A| (r - 1)^2 / (2 eps)); a quadratic pull back toward r = 1 instead of a hard clip."""
    (eps,) = trust_region_size("spo", params).values()
    c = _common(inputs)
    penalty = c.adv.abs() * (c.ratio - 1.0) ** 2 / (2.0 * eps)
    loss = -(c.adv * c.ratio - penalty)
    metrics = _metrics(c, inputs.mask, (c.ratio - 1.0).abs() > eps, "outside")
    metrics[f"{TRUST_REGION_PREFIX}penalty"] = _masked_mean(penalty.detach(), inputs.mask)
    return PolicyOutput(loss, metrics)


def drpo_term(inputs: PolicyInputs, params: PolicyParams) -> PolicyOutput:
    """DRPO: SPO's penalty weighted by mu: -(r A - |A| / (2 delta) mu (r - 1)^2).

    Its gradient weight on grad r is A (1 - sign(A (r - 1)) |pi - mu| / delta): the pull back grows with the
    probability-space distance |pi - mu|, so rare tokens may move further in ratio than frequent ones.
    """
    (delta,) = trust_region_size("drpo", params).values()
    c = _common(inputs)
    penalty = c.adv.abs() / (2.0 * delta) * c.mu * (c.ratio - 1.0) ** 2
    loss = -(c.ratio * c.adv - penalty)
    metrics = _metrics(c, inputs.mask, (c.pi - c.mu).abs() > delta, "outside")
    metrics[f"{TRUST_REGION_PREFIX}penalty"] = _masked_mean(penalty.detach(), inputs.mask)
    return PolicyOutput(loss, metrics)


TRUST_REGION_TERMS = {
    "kl3_clip": kl3_clip_term,
    "dppo_tv": dppo_tv_term,
    "dppo_kl": dppo_kl_term,
    "spo": spo_term,
    "drpo": drpo_term,
}
