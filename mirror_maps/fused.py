"""Fast evaluation of the neural map's neuron sum with analytic gradients (the sampled form's hot path).

Autograd through the exact per-neuron formulas (mirror_maps.neurons) stores and re-reads dozens of
[N, 126] intermediates. Here the value and both partial derivatives are computed together, without
autograd, in chunks of tokens that stay in cache, and only two [N] gradient vectors are kept:

    d(p, q)  = sum_j v_j D_j = delta^2 sum_j v_j w_j F_j,     F_j = B_S(u_p, u_q) / e^2
    dd/dp    = sum_j v_j (s_j(u_p) - s_j(u_q)) = delta sum_j v_j w_j G_j,   G_j = divided difference of s_j
    dd/dq    = -h''(q) delta = -delta sum_j v_j w_j s_j'(u_q)

with delta = p - q, e = w_j delta. F_j and G_j are written without cancellation (sums of positive terms,
or a short series where the closed form would cancel), so the float32 gradient is as accurate as the
value when p is close to q. A neuron whose kink (u = 0 for sqrt, cbrt, log) lies inside the range of
the data, or within rounding of it, goes through the exact branchy formulas of mirror_maps.neurons; the
others use branch-free formulas, and neurons clamped on the whole range are skipped. Likewise the exp and
log blocks use a pure series where a per-neuron bound on its argument allows, and series-or-closed-form
per element only otherwise.

Parameters are treated as constants: NeuralMirrorMap uses this path only when they need no gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from mirror_maps.neurons import BLOCK_BREGMAN, LOG_OFFSET, NEURONS_PER_BLOCK, NUM_NEURONS
from mirror_maps.numerics import PROB_FLOOR, generalized_kl, phi2

CHUNK_TOKENS = 1536
"""Tokens per chunk on the CPU. [21, 1536] temporaries (126 KiB in float32) stay in a core's L2, and at
32,256 elements every elementwise op stays below torch's intra-op parallel grain (32,768): on a CPU shared
with other processes, a 2-thread op waits for a descheduled thread, which made small ops 10-50x slower in
tests."""
CUDA_CHUNK_TOKENS = 262144
"""Tokens per chunk on a CUDA device. Each chunk launches a hundred or more small kernels from Python, and
on a GPU that launch cost, not the arithmetic, sets the time: fwd+bwd of 262,144 tokens on an H100 took
267 ms with chunks of 1,536, 56 ms with 8,192, 11 ms with 65,536 and 5.9 ms with 262,144 (one chunk),
for a working set of 327 MiB (bench/sweep_chunks_cuda.py, docs/benchmarks.md)."""

_EXP_SERIES_BOUND = 0.5
"""An exp neuron is series-only if |w_j| max|p - q| stays below this (the series then converges fast)."""
_LOG_SWITCH = 0.25
"""Log block, r = w_j (p - q) / (u_q + eps): the series of ((1 + r) log1p(r) - r)/r^2 is used for |r| below
this, the closed form (relative error ~4 ulp/|r| <= 16 ulp) above; a neuron whose |r| provably stays below
it needs no closed form at all."""

_CUBE, _SQUARE, _SQRT, _CBRT, _LOG, _EXP = range(6)


# ------------------------------------------------------------------------------------------- series
def _phi2_coefficient(k: int) -> float:
    return 1.0 / math.factorial(k + 2)  # (e^x - 1 - x) / x^2


def _phi1_coefficient(k: int) -> float:
    return 1.0 / math.factorial(k + 1)  # (e^x - 1) / x


def _kl_ratio_coefficient(k: int) -> float:
    return (-1.0) ** k / ((k + 1) * (k + 2))  # ((1 + r) log1p(r) - r) / r^2


def _log_ratio_coefficient(k: int) -> float:
    return (-1.0) ** k / (k + 1)  # log1p(r) / r


def _series_coefficients(coefficient, bound: float, dtype: torch.dtype) -> list[float]:
    """Coefficients c_0..c_m with the dropped tail below a quarter ulp of c_0 for |x| <= bound (< 1).

    Every series above has |c_{k+1}| <= |c_k|, so the tail is at most |c_{m+1}| bound^(m+1) / (1 - bound).
    """
    target = torch.finfo(dtype).eps / 4 * abs(coefficient(0)) * (1.0 - bound)
    coefficients = [coefficient(0)]
    while abs(coefficient(len(coefficients))) * bound ** len(coefficients) > target:
        coefficients.append(coefficient(len(coefficients)))
    return coefficients


def _series(coefficient, bound: float, like: torch.Tensor) -> list[torch.Tensor]:
    """The coefficients as 0-d tensors of `like`'s dtype and device, made once per call, not per chunk."""
    return [like.new_tensor(c) for c in _series_coefficients(coefficient, bound, like.dtype)]


def _horner(x: torch.Tensor, coefficients: list[torch.Tensor]) -> torch.Tensor:
    """sum_k c_k x^k, one fused multiply-add pass per coefficient."""
    total = torch.empty_like(x).copy_(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        torch.addcmul(coefficient, total, x, out=total)
    return total


# ------------------------------------------------------------------------------------------- plan
@dataclass
class _Plan:
    """Per-call split of the 126 neurons by the data range, and the per-neuron coefficients v_j w_j."""

    w: torch.Tensor  # [126, 1]
    b: torch.Tensor  # [126, 1]
    v: torch.Tensor  # [126]
    smooth: list[torch.Tensor]  # per block: indices of neurons evaluated branch-free
    exact: list[torch.Tensor]  # per block: indices of neurons that need the exact branchy formulas
    series_only: list[bool]  # per block: the smooth neurons need no closed form (exp/log blocks)
    f_series: list[list[torch.Tensor] | None]  # per block: coefficients of F's series (exp/log blocks)
    g_series: list[list[torch.Tensor] | None]  # per block: coefficients of G's series
    w_rows: list[torch.Tensor]  # per block: w of the smooth neurons, [k, 1]
    b_rows: list[torch.Tensor]  # per block: b (b + eps for the log block) of the smooth neurons, [k, 1]
    vw_rows: list[torch.Tensor]  # per block: v_j w_j of the smooth neurons, [k]


def _make_plan(v, w, b, low: float, high: float, max_delta: float) -> _Plan:
    kink_floor = torch.finfo(w.dtype).tiny ** 0.5
    u_low, u_high = w * low + b, w * high + b
    u_min, u_max = torch.minimum(u_low, u_high), torch.maximum(u_low, u_high)
    # fl(w y + b) is within ~2 ulps of (|w y| + |b|) of the exact value, and the exact u is linear in y, so
    # the computed u over [low, high] stays within that slack of its value at the extreme endpoint. The
    # margins (8 ulps) keep "smooth" neurons at u > kink_floor and "clamped" ones at u <= kink_floor.
    slack = 8 * torch.finfo(w.dtype).eps
    y_min = torch.where(u_low <= u_high, torch.full_like(w, low), torch.full_like(w, high))
    y_max = torch.where(u_low <= u_high, torch.full_like(w, high), torch.full_like(w, low))
    smooth_mask = u_min > kink_floor * 2 + slack * (w.abs() * y_min.abs() + b.abs())
    clamped_mask = u_max <= kink_floor - slack * (w.abs() * y_max.abs() + b.abs())
    all_neurons = torch.arange(NUM_NEURONS, device=w.device)
    smooth, exact, series_only, f_series, g_series = [], [], [], [], []
    for block in range(6):
        rows = all_neurons[block * NEURONS_PER_BLOCK : (block + 1) * NEURONS_PER_BLOCK]
        if block in (_SQRT, _CBRT, _LOG):
            smooth_rows = rows[smooth_mask[rows]]
            exact_rows = rows[~smooth_mask[rows] & ~clamped_mask[rows]]
        else:
            smooth_rows, exact_rows = rows, rows[:0]
        smooth.append(smooth_rows)
        exact.append(exact_rows)
        only, f_coefficients, g_coefficients = False, None, None
        if block == _EXP and smooth_rows.numel():
            bound = float(w[smooth_rows].abs().max()) * max_delta
            only = bound < _EXP_SERIES_BOUND
            if only:
                f_coefficients = _series(_phi2_coefficient, bound, w)
                g_coefficients = _series(_phi1_coefficient, bound, w)
        if block == _LOG and smooth_rows.numel():
            x_min = u_min[smooth_rows] + LOG_OFFSET
            bound = float((w[smooth_rows].abs() * max_delta / x_min).max())
            only = bound < _LOG_SWITCH
            f_coefficients = _series(_kl_ratio_coefficient, min(bound, _LOG_SWITCH), w)
            g_coefficients = _series(_log_ratio_coefficient, bound, w) if only else None
        series_only.append(only)
        f_series.append(f_coefficients)
        g_series.append(g_coefficients)
    w_col, b_col = w.unsqueeze(-1), b.unsqueeze(-1)
    # The log block works with x = u + eps directly: its offset is folded into the bias once.
    b_smooth = [b_col[rows] + (LOG_OFFSET if block == _LOG else 0.0) for block, rows in enumerate(smooth)]
    return _Plan(w=w_col, b=b_col, v=v, smooth=smooth, exact=exact, series_only=series_only,
                 f_series=f_series, g_series=g_series, w_rows=[w_col[rows] for rows in smooth],
                 b_rows=b_smooth, vw_rows=[(v * w)[rows] for rows in smooth])


# ------------------------------------------------------------------------------------------- blocks
def _branch_free_block(block: int, u_p, u_q, e, plan: _Plan, grads: bool):
    """(F, G, S') rows [k, C] for smooth neurons of one block: u_p, u_q > 0 wherever the block is kinked.

    G and S' are None when no gradient is needed.
    """
    G = S = None
    if block == _CUBE:  # F = (u_p^2 + 2 u_p u_q + 3 u_q^2)/4, G = u_p^2 + u_p u_q + u_q^2, S' = 3 u_q^2
        pp, pq, qq = u_p * u_p, u_p * u_q, u_q * u_q
        F = torch.add(pp, pq, alpha=2.0).add_(qq, alpha=3.0).mul_(0.25)
        if grads:
            G = pp.add_(pq).add_(qq)
            S = qq.mul_(3.0)
        return F, G, S
    if block == _SQUARE:  # F = (u_p + 2 u_q)/3, G = u_p + u_q, S' = 2 u_q
        F = torch.add(u_p, u_q, alpha=2.0).mul_(1.0 / 3.0)
        if grads:
            G = u_p + u_q
            S = u_q * 2.0
        return F, G, S
    if block == _SQRT:  # G = 1/(s_p + s_q), F = (2 s_p + s_q) G^2 / 3, S' = 1/(2 s_q)
        s_p, s_q = u_p.pow(0.5), u_q.pow(0.5)  # pow, not sqrt: sqrt goes parallel at 2,048 elements
        inverse_sum = torch.add(s_p, s_q).reciprocal_()
        F = torch.add(s_q, s_p, alpha=2.0).mul_(inverse_sum).mul_(inverse_sum).mul_(1.0 / 3.0)
        if grads:
            G = inverse_sum
            S = s_q.reciprocal_().mul_(0.5)
        return F, G, S
    if block == _CBRT:
        # t = u^(1/3), spread = t_p^2 + t_p t_q + t_q^2 = A + t_q^2 with A = t_p (t_p + t_q); G = 1/spread,
        # F = (3 t_p^2 + 2 t_p t_q + t_q^2) / (4 spread^2) = (spread + A + t_p^2) G^2 / 4, S' = 1/(3 t_q^2).
        t_p, t_q = u_p.pow(1.0 / 3.0), u_q.pow(1.0 / 3.0)
        a_term = torch.add(t_p, t_q).mul_(t_p)
        t_q_sq = t_q.mul_(t_q)
        inverse_spread = torch.add(a_term, t_q_sq).reciprocal_()
        F = a_term.addcmul_(t_p, t_p).mul_(inverse_spread).add_(1.0).mul_(inverse_spread).mul_(0.25)
        if grads:
            G = inverse_spread
            S = t_q_sq.reciprocal_().mul_(1.0 / 3.0)
        return F, G, S
    if block == _LOG:
        # Here u_p, u_q are x = u + eps and r = e / x_q. F = ((1 + r) L - r)/(r^2 x_q) with L = log1p(r), as a
        # series in r for small |r|; G = (L / r)/x_q (1/x_q at r = 0); S' = 1/x_q.
        inverse_x_q = u_q.reciprocal()
        r = e * inverse_x_q
        if plan.series_only[block]:
            F = _horner(r, plan.f_series[block]).mul_(inverse_x_q)
            G = _horner(r, plan.g_series[block]).mul_(inverse_x_q) if grads else None
            return F, G, inverse_x_q
        # L = log(x_p/x_q): log1p(r) keeps its digits for r near 0; for r near -1 (x_p << x_q) 1 + r has lost
        # them and the log of the ratio (accurate to an ulp) is used instead.
        ratio = u_p * inverse_x_q
        log_ratio = torch.where(r < -0.5, torch.log(ratio), torch.log1p(r))
        # r == 0 (e zero or underflowed) gets the limits through `at_zero`; dividing by r, not multiplying by
        # 1/e, keeps a subnormal r finite (log1p(r)/r = 1 there).
        at_zero = (r == 0).to(r.dtype)
        r_safe = torch.add(r, at_zero)
        direct = ratio.mul_(log_ratio).sub_(r).div_(r_safe).div_(r_safe).mul_(inverse_x_q)
        small = r.abs() < _LOG_SWITCH
        series = _horner(r.clamp(-_LOG_SWITCH, _LOG_SWITCH), plan.f_series[block]).mul_(inverse_x_q)
        F = torch.where(small, series, direct)
        if grads:
            G = log_ratio.div_(r_safe).add_(at_zero).mul_(inverse_x_q)
            S = inverse_x_q
        return F, G, S
    # _EXP: F = e^{u_q} phi2(e), G = e^{u_q} (e^e - 1)/e, S' = e^{u_q}
    exp_q = torch.exp(u_q)
    if plan.series_only[block]:
        F = _horner(e, plan.f_series[block])
        G = _horner(e, plan.g_series[block]) if grads else None
    else:
        F = phi2(e)
        if grads:
            zero = e == 0
            e_safe = torch.where(zero, torch.ones_like(e), e)
            G = torch.where(zero, torch.ones_like(e), torch.expm1(e_safe) / e_safe)
    F.mul_(exp_q)
    if grads:
        G.mul_(exp_q)
        S = exp_q
    return F, G, S


def exact_block(block: int, p_row, q_row, w, b, grads: bool):
    """(D, dD/dp, dD/dq) rows [k, C] for kinked neurons whose kink may lie between the data points."""
    value = BLOCK_BREGMAN[block](p_row, q_row, w, b)
    if not grads:
        return value, None, None
    u_p, u_q = w * p_row + b, w * q_row + b
    kink_floor = torch.finfo(u_p.dtype).tiny ** 0.5
    pos_p, pos_q = u_p > kink_floor, u_q > kink_floor
    one = torch.ones_like(u_p)
    zero = torch.zeros_like(u_p)
    u_p_safe, u_q_safe = torch.where(pos_p, u_p, one), torch.where(pos_q, u_q, one)
    w_delta = w * (p_row - q_row)
    if block == _LOG:
        x_p = torch.where(pos_p, u_p, zero) + LOG_OFFSET
        x_q = torch.where(pos_q, u_q, zero) + LOG_OFFSET
        diff = torch.where(pos_p & pos_q, w_delta, x_p - x_q)
        relative = diff / x_q
        d_p = torch.where(relative < -0.5, torch.log(x_p / x_q), torch.log1p(relative))
        d_q = torch.where(pos_q, -w_delta / x_q, zero)
        return value, d_p, d_q
    power = 0.5 if block == _SQRT else 1.0 / 3.0
    root_p, root_q = u_p_safe.pow(power), u_q_safe.pow(power)
    if block == _SQRT:
        both = w_delta / (root_p + root_q)
    else:
        both = w_delta / (root_p * root_p + root_p * root_q + root_q * root_q)
    d_p = torch.where(pos_p & pos_q, both, torch.where(pos_p, root_p, torch.where(pos_q, -root_q, zero)))
    d_q = torch.where(pos_q, -w_delta * power * root_q / u_q_safe, zero)
    return value, d_p, d_q


# ------------------------------------------------------------------------------------------- driver
def _chunk(p: torch.Tensor, q: torch.Tensor, plan: _Plan, grads: bool):
    """(sum_j v_j D_j, its d/dp, its d/dq) for one chunk of tokens p, q of shape [C]."""
    delta = p - q
    p_row, q_row, delta_row = p.unsqueeze(0), q.unsqueeze(0), delta.unsqueeze(0)
    f_sum = torch.zeros_like(p)
    g_sum = torch.zeros_like(p) if grads else None
    s_sum = torch.zeros_like(p) if grads else None
    value = torch.zeros_like(p)
    d_p = torch.zeros_like(p) if grads else None
    d_q = torch.zeros_like(p) if grads else None
    for block in range(6):
        rows = plan.smooth[block]
        if rows.numel():
            w_rows, b_rows = plan.w_rows[block], plan.b_rows[block]
            u_p, u_q = torch.addcmul(b_rows, w_rows, p_row), torch.addcmul(b_rows, w_rows, q_row)
            e = w_rows * delta_row if block in (_LOG, _EXP) else None
            F, G, S = _branch_free_block(block, u_p, u_q, e, plan, grads)
            coefficient = plan.vw_rows[block]
            f_sum.addmv_(F.t(), coefficient)
            if grads:
                g_sum.addmv_(G.t(), coefficient)
                s_sum.addmv_(S.t(), coefficient)
        rows = plan.exact[block]
        if rows.numel():
            D, D_p, D_q = exact_block(block, p_row, q_row, plan.w[rows], plan.b[rows], grads)
            coefficient = plan.v[rows]
            value.addmv_(D.t(), coefficient)
            if grads:
                d_p.addmv_(D_p.t(), coefficient)
                d_q.addmv_(D_q.t(), coefficient)
    value.addcmul_(f_sum, delta * delta)
    if grads:
        d_p.addcmul_(g_sum, delta)
        d_q.addcmul_(s_sum, delta, value=-1.0)
    return value, d_p, d_q


def _range_of(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float, float]:
    low = float(torch.minimum(p.min(), q.min()))
    high = float(torch.maximum(p.max(), q.max()))
    return low, high, float((p - q).abs().max())


def chunk_tokens_for(device: torch.device) -> int:
    """Tokens per chunk on `device`: cache-sized on the CPU, launch-amortising on CUDA (see the constants).

    Other device types keep the CPU value, since no measurement backs another choice for them.
    """
    return CUDA_CHUNK_TOKENS if device.type == "cuda" else CHUNK_TOKENS


def neuron_sum_with_grads(p, q, v, w, b, grads: bool, chunk_tokens: int | None = None):
    """sum_j v_j D_j(p, q) for flat p, q [N], and (if `grads`) its partial derivatives, each [N]."""
    chunk_tokens = chunk_tokens or chunk_tokens_for(p.device)
    value = torch.empty_like(p)
    d_p = torch.empty_like(p) if grads else None
    d_q = torch.empty_like(p) if grads else None
    if p.numel() == 0:
        return value, d_p, d_q
    plan = _make_plan(v, w, b, *_range_of(p, q))
    for start in range(0, p.numel(), chunk_tokens):
        stop = start + chunk_tokens
        chunk_value, chunk_p, chunk_q = _chunk(p[start:stop], q[start:stop], plan, grads)
        value[start:stop] = chunk_value
        if grads:
            d_p[start:stop] = chunk_p
            d_q[start:stop] = chunk_q
    return value, d_p, d_q


class _NeuralBregman(torch.autograd.Function):
    """d(p, q) of the neural map with constant parameters; backward multiplies the saved partials.

    The partials are saved as plain tensors, so a second derivative would silently be zero: backward is
    marked once_differentiable and double backward raises instead.
    """

    @staticmethod
    def forward(ctx, p, q, v, w, b, a, c):
        grads = bool(ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        flat_p, flat_q = p.reshape(-1), q.reshape(-1)
        neurons, d_p, d_q = neuron_sum_with_grads(flat_p, flat_q, v, w, b, grads)
        delta = flat_p - flat_q
        value = neurons.add_(generalized_kl(flat_p, flat_q), alpha=float(c)).addcmul_(delta, delta, value=0.5 * float(a))
        if grads:
            p_c, q_c = flat_p.clamp_min(PROB_FLOOR), flat_q.clamp_min(PROB_FLOOR)
            delta_c = p_c - q_c
            # d/dp [p log(p/q) - p + q] = log(p/q): log1p((p - q)/q) keeps its digits when p is near q,
            # log of the ratio when p << q (where 1 + (p - q)/q would round away p/q).
            relative = delta_c / q_c
            log_ratio = torch.where(relative.abs() < 0.5, torch.log1p(relative), torch.log(p_c / q_c))
            d_p.add_(log_ratio * (flat_p >= PROB_FLOOR), alpha=float(c)).add_(delta, alpha=float(a))
            d_q.add_(relative * (flat_q >= PROB_FLOOR), alpha=-float(c)).add_(delta, alpha=-float(a))
            ctx.save_for_backward(d_p.reshape(p.shape), d_q.reshape(q.shape))
        return value.reshape(p.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        d_p, d_q = ctx.saved_tensors
        grad_p = grad_output * d_p if ctx.needs_input_grad[0] else None
        grad_q = grad_output * d_q if ctx.needs_input_grad[1] else None
        return grad_p, grad_q, None, None, None, None, None


def fused_bregman(p, q, v, w, b, a, c) -> torch.Tensor:
    """The neural map's d(p, q) with parameters (v, w, b, a, c) held constant; differentiable in p and q."""
    p, q = torch.broadcast_tensors(p, q)
    return _NeuralBregman.apply(p, q, v.detach(), w.detach(), b.detach(), a.detach(), c.detach())
