"""How much of the update the regularizer makes: ||grad of coef * D term|| / ||grad of the policy term||.

A ratio of loss VALUES cannot say this: on-policy the policy term's value is ~0 (the advantages of a group sum
to zero) while its gradient is not, so a value ratio swings between 0 and 1 from batch to batch. Gradients can.

Two measurements:
- exact: w.r.t. the trainable parameters (``exact_share``), two ``torch.autograd.grad`` calls through the
  model, i.e. about two extra backward passes; done once per run (the trainer picks the batch).
- per step, cheap: w.r.t. what the loss sees per token, never back through the model. Sampled forms: the
  sampled token's log-prob (``logp_space_share``), through which both terms reach the model. Full form: the
  completion logits (``logit_space_share``), from per-token norms the trainer collects while the logits exist
  (``full_form_token_norms``, closed form, no autograd). Both are the exact share in that space; how well they
  track the parameter-space share is measured by bench/bench_grad_share.py (docs/benchmarks.md).

At the first step of a run the share is exactly 0 for every divergence we offer: the policy equals the
reference there, where a Bregman divergence (and the k2 / k3 estimators) has a zero gradient.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mirror_maps import Potential


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


#: bytes of work per vocabulary entry while ``Potential.h_prime`` runs: the neural map holds u = w y + b and its
#: activations, 126 float32 each, and their blocks' temporaries (measured on the CPU: 1.7 KB per entry, ~430x the
#: float32 entry it reads; over a chunk's whole logits, with h'(q) beside it, the step's 8 GB at Qwen3's vocabulary)
H_PRIME_BYTES_PER_ENTRY = 2048
#: float32 tensors of one row's width alive at once beside the slices: p, q, u and the products of the closed form
NORM_ROW_TENSORS = 6
#: the most work the per-step norms take at once; less when the logits themselves are smaller (below), so that the
#: diagnostic never costs more than about the logits it reads
NORM_WORKSPACE_BYTES = 256 * 2**20
#: the least work: below this, slices of a few hundred entries would cost more in calls than they save
NORM_MIN_WORKSPACE_BYTES = 8 * 2**20


def _norm_workspace_bytes(logits: torch.Tensor) -> int:
    return min(NORM_WORKSPACE_BYTES, max(NORM_MIN_WORKSPACE_BYTES, logits.numel() * 4))


def _h_prime_in_slices(potential: Potential, y: torch.Tensor, entries: int) -> torch.Tensor:
    """``potential.h_prime(y)`` for a 2-D ``y``, ``entries`` entries at a time, so its 126-wide work per entry is
    bounded by the slice, not by the chunk's whole vocabulary."""
    flat = y.reshape(-1)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), entries):
        out[start:start + entries] = potential.h_prime(flat[start:start + entries])
    return out.view_as(y)


@torch.no_grad()
def full_form_token_norms(potential: Potential, logits: torch.Tensor, ref_logits: torch.Tensor,
                          targets: torch.Tensor, workspace_bytes: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position (B, T): ||d log p(y_t) / d logits_t|| and ||d D_t / d logits_t|| for the full form.

    With p = softmax(z): d log p_y / dz = e_y - p, whose squared norm is 1 - 2 p_y + sum p^2. For
    D = sum_v d(p_v, q_v) with d(p, q) = h(p) - h(q) - h'(q)(p - q): dD/dp_v = h'(p_v) - h'(q_v) = u_v, and through
    the softmax dD/dz = p * (u - <p, u>). Closed form under no_grad, so it adds nothing to the autograd graph (it
    runs inside the trainer's checkpointed chunks).

    Why in pieces: h' of a neural map works on 126 numbers per vocabulary entry; over a chunk's whole logits at
    Qwen3's vocabulary that was ~430x the logits (8 GB for 2 x 16 tokens). Rows and slices of entries are sized from
    ``workspace_bytes`` (default: the logits' own size, at most NORM_WORKSPACE_BYTES), and every row sums over its
    whole vocabulary as before, so the values are those of the formula evaluated at once.
    """
    vocab = logits.size(-1)
    lead = logits.shape[:-1]
    flat, flat_ref, flat_targets = logits.reshape(-1, vocab), ref_logits.reshape(-1, vocab), targets.reshape(-1)
    budget = workspace_bytes if workspace_bytes is not None else _norm_workspace_bytes(logits)
    rows = max(1, budget // (NORM_ROW_TENSORS * vocab * 4))
    entries = max(1, budget // H_PRIME_BYTES_PER_ENTRY)
    policy_norms, divergence_norms = [], []
    for start in range(0, flat.size(0), rows):
        p = torch.log_softmax(flat[start:start + rows].float(), dim=-1).exp_()
        q = torch.softmax(flat_ref[start:start + rows].float(), dim=-1)
        p_y = p.gather(-1, flat_targets[start:start + rows].unsqueeze(-1)).squeeze(-1)
        policy_norms.append((1.0 - 2.0 * p_y + p.pow(2).sum(-1)).clamp_min(0.0).sqrt())
        u = _h_prime_in_slices(potential, p, entries)
        u -= _h_prime_in_slices(potential, q, entries)
        del q
        u -= (p * u).sum(-1, keepdim=True)
        u *= p
        divergence_norms.append(u.pow_(2).sum(-1).sqrt())
        del p, u
    return torch.cat(policy_norms).reshape(lead), torch.cat(divergence_norms).reshape(lead)


def logit_space_share(policy_term: torch.Tensor, regularizer_term: torch.Tensor, logps: torch.Tensor,
                      divergence: torch.Tensor, policy_norms: torch.Tensor, divergence_norms: torch.Tensor) -> float:
    """The share w.r.t. the completion logits (full form), from the per-token weights the loss gives log p(y_t)
    and D_t (cheap autograd through the loss formula) times the per-token norms of ``full_form_token_norms``.
    Positions are distinct coordinates of the logits, so squared norms add over tokens."""
    (pol,) = torch.autograd.grad(policy_term, logps, retain_graph=True)
    (reg,) = torch.autograd.grad(regularizer_term, divergence, retain_graph=True)
    pol_sq = (pol.float() * policy_norms).pow(2).sum()
    reg_sq = (reg.float() * divergence_norms).pow(2).sum()
    return _ratio(reg_sq, pol_sq)
