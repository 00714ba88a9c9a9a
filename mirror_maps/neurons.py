"""The six neuron blocks of the neural mirror map, vectorised over the 21 neurons of each block.

Neuron j contributes H_j(y) = integral_0^y s_j(w_j t + b_j) dt to the potential. Its Bregman term is
    D_j(p, q) = H_j(p) - H_j(q) - s_j(u_q) (p - q) = B_S(u_p, u_q) / w_j,   u = w_j y + b_j,
where B_S is the Bregman divergence of S (S' = s) in u-space. Evaluating H_j(p) - H_j(q) directly divides
a difference of two large, nearly equal numbers by a tiny w_j; each function below instead writes D_j as
w_j (p - q)^2 times a factor with no cancellation (per-activation closed forms, derived in the comments),
and treats the clamped region u <= 0 and the kink of sqrt/cbrt/log exactly.

All functions take p, q of shape [..., 1] and w, b of shape [21] and return [..., 21].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mirror_maps.numerics import phi2, scaled_generalized_kl

NEURONS_PER_BLOCK = 21
LOG_OFFSET = 1e-3
BLOCK_NAMES = ("cube", "square", "sqrt", "cbrt", "log", "exp")
#: index of the exp block (the one unkinked block taylor_plan may leave to the exact formulas)
EXP_BLOCK = BLOCK_NAMES.index("exp")
NUM_NEURONS = NEURONS_PER_BLOCK * len(BLOCK_NAMES)


def _positive_or_one(u: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """u where u > 0 else 1, so roots and logs of the unselected branch stay finite (and so do grads)."""
    return torch.where(positive, u, torch.ones_like(u))


def _cube(p, q, w, b):
    # B_S for S = u^4/4 is e^2 (1.5 u_q^2 + u_q e + e^2/4) = e^2 (0.25 (e + 2 u_q)^2 + 0.5 u_q^2): a sum of squares.
    delta = p - q
    e = w * delta
    u_q = w * q + b
    return w * delta * delta * (0.25 * (e + 2.0 * u_q) ** 2 + 0.5 * u_q * u_q)


def _square(p, q, w, b):
    # B_S for S = u^3/3 is e^2 (u_q + e/3).
    delta = p - q
    e = w * delta
    u_q = w * q + b
    return w * delta * delta * (u_q + e / 3.0)


def _exp(p, q, w, b):
    # B_S for S = e^u is e^{u_q} (e^e - 1 - e) = e^{u_q} e^2 phi2(e).
    delta = p - q
    e = w * delta
    return torch.exp(w * q + b) * w * delta * delta * phi2(e)


def _kinked_pieces(p, q, w, b):
    """Shared set-up for the blocks clamped at u <= 0: u values, sign masks and a division-safe w."""
    delta = p - q
    u_p = w * p + b
    u_q = w * q + b
    # u in (0, kink_floor] counts as clamped: there the roots' derivatives overflow in autograd, and the
    # value this drops is below 0.75 * kink_floor^(1/3) per neuron (~4e-7 for float32, 1e-51 for float64),
    # reached only when |w| itself is ~kink_floor.
    kink_floor = torch.finfo(u_p.dtype).tiny ** 0.5
    pos_p = u_p > kink_floor
    pos_q = u_q > kink_floor
    # Straddling the kink needs u_p != u_q, hence w != 0; w_safe only guards unselected branches.
    w_safe = torch.where(w == 0, torch.ones_like(w), w)
    return delta, u_p, u_q, pos_p, pos_q, w_safe


def _sqrt(p, q, w, b):
    # S = (2/3) u+^{3/2}. Both u > 0: B_S = (1/3)(s_p - s_q)^2 (2 s_p + s_q) with s_p - s_q = e / (s_p + s_q).
    # Only u_p > 0: B_S = (2/3) u_p^{3/2}. Only u_q > 0: B_S = s_q (u_q/3 - u_p), two non-negative parts.
    delta, u_p, u_q, pos_p, pos_q, w_safe = _kinked_pieces(p, q, w, b)
    s_p = torch.sqrt(_positive_or_one(u_p, pos_p))
    s_q = torch.sqrt(_positive_or_one(u_q, pos_q))
    both = w * delta * delta * (2.0 * s_p + s_q) / (3.0 * (s_p + s_q) ** 2)
    only_p = (2.0 / 3.0) * (u_p / w_safe) * s_p
    only_q = s_q * (u_q / 3.0 - u_p) / w_safe
    zero = torch.zeros_like(both)
    return torch.where(pos_p & pos_q, both, torch.where(pos_p, only_p, torch.where(pos_q, only_q, zero)))


def _cbrt(p, q, w, b):
    # S = (3/4) u+^{4/3}, t = u^{1/3}. Both u > 0: B_S = (1/4)(t_p - t_q)^2 (3 t_p^2 + 2 t_p t_q + t_q^2)
    # with t_p - t_q = e / (t_p^2 + t_p t_q + t_q^2). Only u_p > 0: (3/4) u_p t_p. Only u_q > 0: t_q (u_q/4 - u_p).
    delta, u_p, u_q, pos_p, pos_q, w_safe = _kinked_pieces(p, q, w, b)
    t_p = _positive_or_one(u_p, pos_p).pow(1.0 / 3.0)
    t_q = _positive_or_one(u_q, pos_q).pow(1.0 / 3.0)
    spread = t_p * t_p + t_p * t_q + t_q * t_q
    both = w * delta * delta * (3.0 * t_p * t_p + 2.0 * t_p * t_q + t_q * t_q) / (4.0 * spread * spread)
    only_p = 0.75 * (u_p / w_safe) * t_p
    only_q = t_q * (u_q / 4.0 - u_p) / w_safe
    zero = torch.zeros_like(both)
    return torch.where(pos_p & pos_q, both, torch.where(pos_p, only_p, torch.where(pos_q, only_q, zero)))


def _log(p, q, w, b):
    # s = log(u+ + eps). With x = u+ + eps, S is x log x - x for u > 0 and linear for u <= 0, so
    # B_S = x_p log(x_p/x_q) - x_p + x_q whenever u_p > 0 or both are clamped, and when only u_q > 0 it is
    # that term plus (-u_p) log(x_q / eps). x_p - x_q is e (both > 0), u_p or -u_q (one > 0), or 0.
    delta, u_p, u_q, pos_p, pos_q, w_safe = _kinked_pieces(p, q, w, b)
    zero = torch.zeros_like(u_p)
    both = pos_p & pos_q
    u_p_plus = torch.where(pos_p, u_p, zero)
    u_q_plus = torch.where(pos_q, u_q, zero)
    x_p = u_p_plus + LOG_OFFSET
    x_q = u_q_plus + LOG_OFFSET
    diff = torch.where(both, w * delta, u_p_plus - u_q_plus)
    diff_over_w = torch.where(both, delta.expand_as(diff), (u_p_plus - u_q_plus) / w_safe)
    main = scaled_generalized_kl(x_p, x_q, diff, diff_over_w)
    only_q = pos_q & ~pos_p
    extra = torch.where(only_q, (-u_p / w_safe) * torch.log1p(u_q_plus / LOG_OFFSET), zero)
    return main + extra


BregmanBlock = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

BLOCK_BREGMAN: tuple[BregmanBlock, ...] = (_cube, _square, _sqrt, _cbrt, _log, _exp)
"""Per-block D_j(p, q), in the layout order u^3, u^2, sqrt, cbrt, log, exp."""


def activations(u: torch.Tensor) -> torch.Tensor:
    """s_j(u) for u of shape [..., 126] laid out as six blocks of 21: u^3, u^2, sqrt, cbrt, log, exp."""
    cube, square, root2, root3, log_, exp_ = u.split(NEURONS_PER_BLOCK, dim=-1)
    pos2, pos3 = root2 > 0, root3 > 0
    zero2, zero3 = torch.zeros_like(root2), torch.zeros_like(root3)
    return torch.cat(
        [
            cube**3,
            square**2,
            torch.where(pos2, torch.sqrt(_positive_or_one(root2, pos2)), zero2),
            torch.where(pos3, _positive_or_one(root3, pos3).pow(1.0 / 3.0), zero3),
            torch.log(log_.clamp_min(0.0) + LOG_OFFSET),
            torch.exp(exp_),
        ],
        dim=-1,
    )


def neuron_bregman(
    p: torch.Tensor,
    q: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    selected: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_j v_j D_j(p, q) for p, q of any (broadcastable) shape and v, w, b of shape [126].

    `selected` (bool [126]) restricts the sum to some neurons; blocks with none selected are skipped.
    """
    p_col = p.unsqueeze(-1)
    q_col = q.unsqueeze(-1)
    total = torch.zeros(torch.broadcast_shapes(p.shape, q.shape), dtype=p.dtype, device=p.device)
    masks = selected.split(NEURONS_PER_BLOCK) if selected is not None else [None] * len(BLOCK_BREGMAN)
    for block, v_k, w_k, b_k, mask in zip(
        BLOCK_BREGMAN,
        v.split(NEURONS_PER_BLOCK),
        w.split(NEURONS_PER_BLOCK),
        b.split(NEURONS_PER_BLOCK),
        masks,
    ):
        if mask is not None:
            if not bool(mask.any()):
                continue
            v_k, w_k, b_k = v_k[mask], w_k[mask], b_k[mask]
        total = total + block(p_col, q_col, w_k, b_k) @ v_k
    return total
