"""Cancellation-free building blocks shared by every divergence in this package.

Bregman divergences are differences of nearly equal numbers when p is close to q; the helpers here
rewrite those differences as products of quantities that are each computed to full relative precision.
Every helper is `torch.where`-safe: unselected branches are fed harmless values so autograd never
multiplies a zero by an infinity.
"""

from __future__ import annotations

import math

import torch

PROB_FLOOR = 1e-10
"""Probabilities are clamped here before any logarithm, as in the authors' code (docs/method.md §1)."""

_SERIES_RADIUS = 0.5


def _phi2_coefficients(dtype: torch.dtype) -> list[float]:
    """Taylor coefficients 1/(n+2)! of phi2, enough for full precision of `dtype` on |x| < 0.5."""
    terms = 15 if dtype == torch.float64 else 8
    return [1.0 / math.factorial(n + 2) for n in range(terms)]


def phi2(x: torch.Tensor) -> torch.Tensor:
    """(e^x - 1 - x) / x^2, accurate for every x (a Taylor series near 0, where the direct form cancels)."""
    small = x.abs() < _SERIES_RADIUS
    x_small = torch.where(small, x, torch.zeros_like(x))
    x_big = torch.where(small, torch.ones_like(x), x)
    direct = (torch.expm1(x_big) - x_big) / (x_big * x_big)
    coefficients = _phi2_coefficients(x.dtype)
    series = torch.full_like(x, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        series = series * x_small + coefficient
    return torch.where(small, series, direct)


def scaled_generalized_kl(
    x: torch.Tensor, y: torch.Tensor, diff: torch.Tensor, diff_scaled: torch.Tensor
) -> torch.Tensor:
    """[x log(x/y) - x + y] * diff_scaled / diff for x, y > 0, where diff = x - y.

    Written as (x/y) * L * (L/r) * phi2(-L) * diff_scaled with r = diff/y and L = log(x/y): every factor
    is accurate and positive-scaled, so nothing cancels when x is close to y. Passing diff_scaled = diff
    gives the plain generalized-KL term; passing diff/w gives that term divided by w without ever
    dividing a rounded difference by a tiny w (the log neuron block needs this).
    """
    ratio = x / y
    r = diff / y
    near = r.abs() < _SERIES_RADIUS
    # log1p(r)/r = 1 - r/2 + O(r^2): below 1e-8 the two-term form is exact in float64 and it keeps autograd
    # from dividing by r^2 when r is subnormal.
    tiny_r = r.abs() < 1e-8
    r_safe = torch.where(tiny_r, torch.ones_like(r), r)
    log_near = torch.log1p(torch.where(near, r, torch.zeros_like(r)))
    log_far = torch.log(torch.where(near, torch.ones_like(ratio), ratio))
    log_ratio = torch.where(near, log_near, log_far)
    log_over_r = torch.where(tiny_r, 1.0 - 0.5 * r, log_ratio / r_safe)
    return ratio * log_ratio * log_over_r * phi2(-log_ratio) * diff_scaled


def generalized_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """p log(p/q) - p + q elementwise, with p and q clamped at PROB_FLOOR first; always >= 0."""
    p = p.clamp_min(PROB_FLOOR)
    q = q.clamp_min(PROB_FLOOR)
    diff = p - q
    return scaled_generalized_kl(p, q, diff, diff)


def generalized_kl_from_logs(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """p log(p/q) - p + q from log-probabilities, = p * L^2 * phi2(-L) with L = logp - logq.

    Used by the full-vocabulary form: it needs no clamp (log-softmax is exact for tiny probabilities)
    and every term is >= 0, so a sum over 151,936 entries does not cancel.
    """
    log_ratio = logp - logq
    return torch.exp(logp) * log_ratio * log_ratio * phi2(-log_ratio)
