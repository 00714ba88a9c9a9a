"""Convex potentials on a scalar probability and their elementwise Bregman divergences.

A potential h gives d(p, q) = h(p) - h(q) - h'(q)(p - q). Every potential computes d(p, q) with its own
cancellation-free formula rather than that difference, because the difference loses all digits when p is
close to q. The sampled and full-vocabulary forms (mirror_maps.forms) only call `bregman` and
`bregman_from_logprobs`, so any potential here plugs into both.
"""

from __future__ import annotations

import abc

import torch

from mirror_maps.numerics import PROB_FLOOR, generalized_kl, generalized_kl_from_logs


class Potential(abc.ABC):
    """Elementwise convex potential h on probabilities; all methods work on tensors of any shape."""

    name: str = "potential"

    @abc.abstractmethod
    def h(self, y: torch.Tensor) -> torch.Tensor:
        """The potential h(y)."""

    @abc.abstractmethod
    def h_prime(self, y: torch.Tensor) -> torch.Tensor:
        """Its derivative h'(y) (the inverse mirror map)."""

    @abc.abstractmethod
    def bregman(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """d(p, q) = h(p) - h(q) - h'(q)(p - q), elementwise, evaluated without cancellation."""

    def bregman_from_logprobs(self, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
        """d(exp(logp), exp(logq)); potentials with a log term override it to skip the clamp."""
        return self.bregman(torch.exp(logp), torch.exp(logq))

    def bregman_and_slope_from_logprobs(self, logp: torch.Tensor,
                                        logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d, dd/dlogp) elementwise, d as ``bregman_from_logprobs``; no graph is kept.

        Why: the full form's gradient through the softmax is, per entry, this slope minus p times its sum over the
        vocabulary (mirror_maps.tiled), so a tile needs the slope, not an autograd graph over the whole vocabulary.
        Autograd on the value here (a tile's worth of graph at a time); potentials with a closed form override it.
        """
        with torch.enable_grad():
            leaf = logp.detach().requires_grad_(True)
            value = self.bregman_from_logprobs(leaf, logq.detach())
            (slope,) = torch.autograd.grad(value.sum(), leaf)
        return value.detach(), slope


class KL(Potential):
    """h(y) = y log y, whose elementwise Bregman term is p log(p/q) - p + q (summing to KL over a simplex).

    Probabilities are clamped at 1e-10 before the logarithm (as the authors' code does), so d is finite
    for every p, q in [0, 1]; the full-vocabulary form works from log-probabilities and needs no clamp.
    """

    name = "kl"

    def h(self, y: torch.Tensor) -> torch.Tensor:
        y = y.clamp_min(PROB_FLOOR)
        return y * torch.log(y)

    def h_prime(self, y: torch.Tensor) -> torch.Tensor:
        return torch.log(y.clamp_min(PROB_FLOOR)) + 1.0

    def bregman(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return generalized_kl(p, q)

    def bregman_from_logprobs(self, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
        return generalized_kl_from_logs(logp, logq)

    def bregman_and_slope_from_logprobs(self, logp: torch.Tensor,
                                        logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # d/dlogp [p log(p/q) - p + q] = p (logp - logq)
        return generalized_kl_from_logs(logp, logq), torch.exp(logp) * (logp - logq)


class ProbL2(Potential):
    """h(y) = y^2 / 2, so d(p, q) = 1/2 (p - q)^2.

    The authors' code uses (p - q)^2 without the 1/2; their lambda is therefore twice ours for the same
    penalty.
    """

    name = "prob_l2"

    def h(self, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * y * y

    def h_prime(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def bregman(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        delta = p - q
        return 0.5 * delta * delta

    def bregman_and_slope_from_logprobs(self, logp: torch.Tensor,
                                        logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # d/dlogp [1/2 (p - q)^2] = p (p - q)
        p = torch.exp(logp)
        delta = p - torch.exp(logq)
        return 0.5 * delta * delta, p * delta
