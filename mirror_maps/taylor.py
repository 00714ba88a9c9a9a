"""Fast, accurate neuron sum for small probabilities: one Taylor polynomial instead of 126 neurons.

The full-vocabulary form evaluates d(p_v, q_v) for ~150k entries per position, almost all of them with
p and q far below 1e-3. Near y = 0 every neuron whose activation is analytic on a disc of radius
R_j >= RADIUS_MARGIN * SMALL_PROB around y = 0 has a convergent Taylor series, so the sum over those
neurons collapses into one polynomial g(y) = sum_k G_k (y / SMALL_PROB)^k, computed once per call from the
parameters. Its Bregman term is
    g(p) - g(q) - g'(q)(p - q) = dz^2 sum_{k>=2} G_k T_k(zp, zq),   z = y / SMALL_PROB,
with T_k = sum_i (i + 1) zq^i zp^(k-2-i) >= 0 built by a two-term recurrence: no cancellation and no
transcendental function per entry. Truncation after `degree` terms leaves a relative error below
RADIUS_MARGIN^-(degree-1) (chosen per dtype below unit roundoff). Neurons too close to their kink
(R_j small) and entries with max(p, q) > SMALL_PROB (2^-10) go through the exact per-neuron formulas instead.
"""

from __future__ import annotations

import math

import torch

from mirror_maps.neurons import LOG_OFFSET, NEURONS_PER_BLOCK

SMALL_PROB = 2.0**-10
"""~1e-3, a power of two so that y / SMALL_PROB is exact and zp - zq keeps every digit of p - q."""
RADIUS_MARGIN = 8.0


def taylor_degree(dtype: torch.dtype) -> int:
    """Highest power kept: RADIUS_MARGIN^-(degree-1) below the dtype's unit roundoff."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return 1 + math.ceil(math.log(1.0 / unit_roundoff) / math.log(RADIUS_MARGIN)) + 1


def _power_series(alpha: float, b: torch.Tensor, rho: torch.Tensor, degree: int) -> torch.Tensor:
    """Coefficients c_2..c_degree of H(y0 z) for s = u^alpha at u = b > 0, with rho = w y0 / b.

    c_k = s^(k-1)(b) w^(k-1) y0^k / k!, so c_{k+1} = c_k (alpha - k + 1) rho / (k + 1).
    """
    coefficient = alpha * b.pow(alpha) * rho * SMALL_PROB / 2.0
    columns = [coefficient]
    for k in range(2, degree):
        coefficient = coefficient * (alpha - k + 1) * rho / (k + 1)
        columns.append(coefficient)
    return torch.stack(columns, dim=-1)


def _log_series(b: torch.Tensor, w: torch.Tensor, degree: int) -> torch.Tensor:
    """c_k = y0 (-1)^k rho^(k-1) / (k (k-1)) for s = log(u + eps), rho = w y0 / (b + eps)."""
    rho = w * SMALL_PROB / (b + LOG_OFFSET)
    columns = [SMALL_PROB * rho / 2.0]
    for k in range(2, degree):
        columns.append(-columns[-1] * rho * (k - 1) / (k + 1))
    return torch.stack(columns, dim=-1)


def _polynomial_series(powers: list[torch.Tensor], degree: int, like: torch.Tensor) -> torch.Tensor:
    """Given exact c_2, c_3, ... of a polynomial H, pad with zeros up to `degree`."""
    columns = powers + [torch.zeros_like(like)] * (degree - 1 - len(powers))
    return torch.stack(columns[: degree - 1], dim=-1)


def taylor_plan(
    v: torch.Tensor, w: torch.Tensor, b: torch.Tensor, degree: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G [degree-1] for powers 2..degree, boolean mask [126] of neurons that must be evaluated exactly).

    Computed in float64 from the (transformed) parameters, so gradients reach them.
    """
    v, w, b = v.double(), w.double(), b.double()
    y0 = SMALL_PROB
    cube_w, square_w, sqrt_w, cbrt_w, log_w, exp_w = w.split(NEURONS_PER_BLOCK)
    cube_b, square_b, sqrt_b, cbrt_b, log_b, exp_b = b.split(NEURONS_PER_BLOCK)

    cube = _polynomial_series(
        [1.5 * cube_b**2 * cube_w * y0**2, cube_b * cube_w**2 * y0**3, cube_w**3 * y0**4 / 4.0], degree, cube_w
    )
    square = _polynomial_series([square_b * square_w * y0**2, square_w**2 * y0**3 / 3.0], degree, square_w)
    exp_columns = [torch.exp(exp_b) * exp_w * y0**2 / 2.0]
    for k in range(2, degree):
        exp_columns.append(exp_columns[-1] * exp_w * y0 / (k + 1))
    exp_series = torch.stack(exp_columns, dim=-1)
    # exp is entire, but the series only converges fast when |w| y0 is small.
    exp_exact = exp_w.abs() * y0 * RADIUS_MARGIN > 1.0
    exp_series = torch.where(exp_exact.unsqueeze(-1), torch.zeros_like(exp_series), exp_series)

    kinked_series = []
    kinked_exact = []
    for alpha, w_k, b_k in ((0.5, sqrt_w, sqrt_b), (1.0 / 3.0, cbrt_w, cbrt_b), (None, log_w, log_b)):
        offset = LOG_OFFSET if alpha is None else 0.0
        # Clamped on all of [0, y0]: s is constant there, so H is linear and contributes nothing.
        clamped = b_k + w_k.clamp_min(0.0) * y0 <= 0
        # Unclamped on [0, y0] with the nearest singularity (u = -offset) and the kink (u = 0) far away.
        positive_b = b_k > 0
        b_safe = torch.where(positive_b, b_k, torch.ones_like(b_k))
        far_singularity = (b_safe + offset) >= RADIUS_MARGIN * y0 * w_k.abs()
        far_kink = b_safe >= RADIUS_MARGIN * y0 * (-w_k).clamp_min(0.0)
        analytic = positive_b & far_singularity & far_kink
        if alpha is None:
            series = _log_series(b_safe, w_k, degree)
        else:
            series = _power_series(alpha, b_safe, w_k * y0 / b_safe, degree)
        series = torch.where(analytic.unsqueeze(-1), series, torch.zeros_like(series))
        kinked_series.append(series)
        kinked_exact.append(~(analytic | clamped))

    per_neuron = torch.cat([cube, square, *kinked_series, exp_series], dim=0)
    exact = torch.cat(
        [torch.zeros(2 * NEURONS_PER_BLOCK, dtype=torch.bool, device=w.device), *kinked_exact,
         exp_exact]
    )
    return v @ per_neuron, exact


def _taylor_terms(p: torch.Tensor, q: torch.Tensor, coefficients: torch.Tensor,
                  slope: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The two-term recurrence shared by the value and its p-derivative (see taylor_bregman_and_slope)."""
    zp = p / SMALL_PROB
    zq = q / SMALL_PROB
    dz = (p - q) / SMALL_PROB
    coefficients = coefficients.to(p.dtype)
    a_k = torch.ones_like(zp)  # A_k = (zp^k - zq^k) / dz, starting at A_1
    t_k = torch.ones_like(zp)  # T_k, starting at T_2
    zq_power = zq.clone()  # zq^(k-1) for the next A update
    total = coefficients[0] * t_k
    derivative = 2.0 * coefficients[0] * a_k if slope else None  # sum_k k G_k A_(k-1), from k = 2
    for index in range(1, coefficients.numel()):  # addcmul: one pass over the entries per update
        a_k = torch.addcmul(zq_power, zp, a_k)
        zq_power = zq_power * zq
        t_k = torch.addcmul(a_k, zq, t_k)
        total = torch.addcmul(total, coefficients[index], t_k)
        if derivative is not None:
            derivative = torch.addcmul(derivative, coefficients[index] * (index + 2), a_k)
    return dz * dz * total, None if derivative is None else derivative * (dz / SMALL_PROB)


def taylor_bregman(p: torch.Tensor, q: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """sum_k G_k [zp^k - zq^k - k zq^(k-1)(zp - zq)] for z = y / SMALL_PROB, valid for p, q <= SMALL_PROB."""
    return _taylor_terms(p, q, coefficients, slope=False)[0]


def taylor_bregman_and_slope(p: torch.Tensor, q: torch.Tensor,
                             coefficients: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(taylor_bregman, its derivative in p). With g(y) = sum_k G_k z^k the derivative is g'(p) - g'(q) =
    dz / SMALL_PROB * sum_k k G_k A_(k-1)(zp, zq), A_m = (zp^m - zq^m) / (zp - zq) = sum_i zp^i zq^(m-1-i) >= 0: the
    same recurrence's A_k, so no cancellation and no autograd graph."""
    value, slope = _taylor_terms(p, q, coefficients, slope=True)
    assert slope is not None
    return value, slope
