"""How much of the update the regularizer makes: ||grad of coef * D term|| / ||grad of the policy term||.

A ratio of loss VALUES cannot say this: on-policy the policy term's value is ~0 (the advantages of a group sum
to zero) while its gradient is not, so a value ratio swings between 0 and 1 from batch to batch. Gradients can.

Two measurements:
- exact: w.r.t. the trainable parameters (``exact_share``), two ``torch.autograd.grad`` calls through the
  model, i.e. about two extra backward passes; done once per run (the trainer picks the batch).
- per step, cheap: w.r.t. what the loss sees per token, never back through the model. Sampled forms: the
  sampled token's log-prob (``logp_space_share``), through which both terms reach the model. Full form: the
  completion logits (``logit_space_share``), from the per-token gradient norms the full form's vocabulary tiles
  accumulate as they pass (mirror_maps.tiled, ``with_norms``): no logits, no autograd over the vocabulary. Both are
  the exact share in that space; how well they track the parameter-space share is measured by
  bench/bench_grad_share.py (docs/benchmarks.md).

At the first step of a run the share is exactly 0 for every divergence we offer: the policy equals the
reference there, where a Bregman divergence (and the k2 / k3 estimators) has a zero gradient.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch



def _ratio(reg_sq: torch.Tensor | float, pol_sq: torch.Tensor | float) -> float:
    reg_sq, pol_sq = float(reg_sq), float(pol_sq)
    if pol_sq <= 0.0:
        return math.nan  # no policy gradient at all (every group had equal rewards): nothing to compare with
    return math.sqrt(reg_sq / pol_sq)


def exact_share(policy_term: torch.Tensor, regularizer_term: torch.Tensor,
                params: Sequence[torch.Tensor]) -> float:
    """The share w.r.t. ``params`` (the trainable parameters); keeps the graph for the trainer's own backward."""
    params = list(params)
    squares = []
    for term in (policy_term, regularizer_term):  # one gradient set alive at a time (full fine-tuning: 1 x params)
        grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        squares.append(sum(float(g.float().pow(2).sum()) for g in grads if g is not None))
        del grads
    return _ratio(squares[1], squares[0])


def logp_space_share(policy_term: torch.Tensor, regularizer_term: torch.Tensor, logps: torch.Tensor) -> float:
    """The share w.r.t. the (B, T) sampled-token log-probs (sampled forms: both terms depend on the model only
    through them). Back-propagates through the loss formula only: microseconds, not a model backward."""
    (pol,) = torch.autograd.grad(policy_term, logps, retain_graph=True)
    (reg,) = torch.autograd.grad(regularizer_term, logps, retain_graph=True)
    return _ratio(reg.float().pow(2).sum(), pol.float().pow(2).sum())


def logit_space_share(policy_term: torch.Tensor, regularizer_term: torch.Tensor, logps: torch.Tensor,
                      divergence: torch.Tensor, policy_norms: torch.Tensor, divergence_norms: torch.Tensor) -> float:
    """The share w.r.t. the completion logits (full form), from the per-token weights the loss gives log p(y_t)
    and D_t (cheap autograd through the loss formula) times the per-token norms ||d log p(y_t)/dz_t|| and
    ||dD_t/dz_t|` (mirror_maps.tiled's ``with_norms``).
    Positions are distinct coordinates of the logits, so squared norms add over tokens."""
    (pol,) = torch.autograd.grad(policy_term, logps, retain_graph=True)
    (reg,) = torch.autograd.grad(regularizer_term, divergence, retain_graph=True)
    pol_sq = (pol.float() * policy_norms).pow(2).sum()
    reg_sq = (reg.float() * divergence_norms).pow(2).sum()
    return _ratio(reg_sq, pol_sq)
