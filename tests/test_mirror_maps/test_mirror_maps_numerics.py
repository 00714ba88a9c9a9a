"""Accuracy of the neural mirror map's Bregman divergence: float32 vs float64 vs 50-digit mpmath."""

from __future__ import annotations

import mpmath
import pytest
import torch

from mirror_maps import NeuralMirrorMap, VECTOR_LENGTH
from mirror_maps.neurons import LOG_OFFSET, NEURONS_PER_BLOCK

REL_TOL = 1e-5
ABS_TOL = 1e-7


def _mp_divergence(v, w, b, a, c, p, q):
    """d(p, q) = h(p) - h(q) - h'(q)(p - q) term by term, at 50 digits (cancellation is harmless there)."""
    eps = mpmath.mpf(LOG_OFFSET)

    def antiderivative(kind, u):
        if kind == 0:
            return u**4 / 4
        if kind == 1:
            return u**3 / 3
        if kind == 2:
            return mpmath.mpf(2) / 3 * max(u, 0) ** mpmath.mpf(1.5)
        if kind == 3:
            return mpmath.mpf(3) / 4 * max(u, 0) ** (mpmath.mpf(4) / 3)
        if kind == 4:
            if u > 0:
                return (u + eps) * mpmath.log(u + eps) - (u + eps)
            return u * mpmath.log(eps) + eps * mpmath.log(eps) - eps
        return mpmath.exp(u)

    def activation(kind, u):
        return [
            lambda: u**3,
            lambda: u**2,
            lambda: mpmath.sqrt(max(u, 0)),
            lambda: max(u, 0) ** (mpmath.mpf(1) / 3),
            lambda: mpmath.log(max(u, 0) + eps),
            lambda: mpmath.exp(u),
        ][kind]()

    total = mpmath.mpf(0)
    for j in range(len(v)):
        kind = j // NEURONS_PER_BLOCK
        if w[j] == 0:
            continue
        u_p, u_q = w[j] * p + b[j], w[j] * q + b[j]
        breg_s = antiderivative(kind, u_p) - antiderivative(kind, u_q) - activation(kind, u_q) * (u_p - u_q)
        total += v[j] * breg_s / w[j]
    total += a / 2 * (p - q) ** 2 + c * (p * mpmath.log(p / q) - p + q)
    return total


def _vector(seed: int, low: float, high: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * (high - low) + low).float()


def _maps() -> dict[str, NeuralMirrorMap]:
    """Parameter regimes that stress different code paths; vectors are float32 so both dtypes share them."""
    tiny_w = _vector(1, 0.0, 0.01)
    tiny_w[126:252] *= torch.logspace(-12, -4, 126).float()
    kinked = _vector(2, 0.1, 1.0)
    kinked[252 + 42 : 252 + 105] = -kinked[126 + 42 : 126 + 105] * torch.linspace(0.05, 0.95, 63).float()
    return {
        "authors_init": NeuralMirrorMap.random_init(42, param_transform="none"),
        "unit_abs": NeuralMirrorMap.from_vector(_vector(3, 0.0, 1.0), "abs"),
        "signed_none": NeuralMirrorMap.from_vector(_vector(4, -1.0, 1.0), "none"),
        "softplus": NeuralMirrorMap.from_vector(_vector(5, -1.0, 1.0), "softplus"),
        "tiny_w": NeuralMirrorMap.from_vector(tiny_w, "none"),
        "kinks_inside_unit_interval": NeuralMirrorMap.from_vector(kinked, "none"),
    }


def _probability_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """p, q over [1e-10, 1]: a log grid of all pairs, plus q within a few float32 ulps or 1e-4 of p."""
    grid = torch.logspace(-10, 0, 31)
    p_grid, q_grid = torch.meshgrid(grid, grid, indexing="ij")
    base = torch.cat([torch.logspace(-10, 0, 41), torch.linspace(0.05, 1.0, 20)])
    near = [base * (1 - k * 6e-8) for k in (1, 3, 17)] + [base * (1 - 1e-4), base * (1 - 1e-2)]
    p = torch.cat([p_grid.flatten()] + [base] * len(near))
    q = torch.cat([q_grid.flatten()] + near)
    return p, q


def _within_tolerance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    error = (actual.double() - expected).abs()
    return (error <= REL_TOL * expected.abs()) | (error <= ABS_TOL)


@pytest.mark.parametrize("regime", list(_maps()))
def test_float32_matches_float64_reference(regime):
    mirror_map = _maps()[regime]
    p, q = _probability_pairs()
    actual = mirror_map.bregman(p, q)
    expected = mirror_map.bregman(p.double(), q.double())
    ok = _within_tolerance(actual, expected)
    worst = (~ok).nonzero().flatten()[:5].tolist()
    assert ok.all(), f"{regime}: float32 off at p={p[worst].tolist()} q={q[worst].tolist()}"


def test_float64_formula_matches_mpmath():
    mpmath.mp.dps = 50
    p = torch.tensor([1e-10, 1e-6, 0.3, 0.3, 0.5, 1.0, 0.7, 1e-3, 0.62, 0.9], dtype=torch.float64)
    q = torch.tensor([3e-10, 2e-6, 0.3 + 1e-9, 0.9, 0.5 - 1e-12, 1e-10, 0.69999, 0.2, 0.0601, 0.4], dtype=torch.float64)
    for name in ("signed_none", "tiny_w", "kinks_inside_unit_interval"):
        mirror_map = _maps()[name]
        v, w, b, a, c = (t.tolist() for t in mirror_map.parameters_for(torch.float64))
        params = [[mpmath.mpf(x) for x in v], [mpmath.mpf(x) for x in w], [mpmath.mpf(x) for x in b]]
        actual = mirror_map.bregman(p, q)
        for i in range(len(p)):
            exact = _mp_divergence(*params, mpmath.mpf(a), mpmath.mpf(c), mpmath.mpf(p[i].item()), mpmath.mpf(q[i].item()))
            assert abs(actual[i].item() - float(exact)) <= 1e-12 * abs(float(exact)) + 1e-300, (name, i)


def test_naive_float32_difference_fails_the_same_tolerance():
    """The reference check is discriminating: h(p) - h(q) - h'(q)(p - q) in float32 misses it for tiny w."""
    mirror_map = _maps()["tiny_w"]
    p, q = _probability_pairs()
    naive = mirror_map.h(p) - mirror_map.h(q) - mirror_map.h_prime(q) * (p - q)
    expected = mirror_map.bregman(p.double(), q.double())
    assert not _within_tolerance(naive, expected).all()


@pytest.mark.parametrize("transform", ["none", "abs", "softplus"])
def test_finite_everywhere_on_closed_unit_square(transform):
    grid = torch.cat([torch.tensor([0.0, 1e-45, 1e-30]), torch.logspace(-12, 0, 25), torch.linspace(0, 1, 11)])
    p, q = torch.meshgrid(grid, grid, indexing="ij")
    p = p.flatten().clone().requires_grad_(True)
    for seed in range(3):
        mirror_map = NeuralMirrorMap.from_vector(_vector(10 + seed, -1.0, 1.0), transform).requires_grad_(True)
        d = mirror_map.bregman(p, q.flatten())
        assert torch.isfinite(d).all()
        grad_p, grad_raw = torch.autograd.grad(d.sum(), [p, mirror_map.raw])
        assert torch.isfinite(grad_p).all() and torch.isfinite(grad_raw).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_at_the_kinks_with_zero_bias(dtype):
    """b = 0 puts u = w y right at the sqrt/cbrt/log kink for tiny and subnormal probabilities."""
    vector = _vector(15, -1.0, 1.0).to(dtype)
    vector[252:378] = 0.0
    grid = torch.tensor([0.0, 1e-45, 1e-40, 1e-38, 1e-30, 1e-20, 1e-12, 1e-10, 1e-6, 0.5, 1.0]).to(dtype)
    p, q = (t.flatten() for t in torch.meshgrid(grid, grid, indexing="ij"))
    p = p.clone().requires_grad_(True)
    for transform in ("none", "abs"):
        mirror_map = NeuralMirrorMap.from_vector(vector, transform).requires_grad_(True)
        d = mirror_map.bregman(p, q)
        grad_p, grad_raw = torch.autograd.grad(d.sum(), [p, mirror_map.raw])
        assert torch.isfinite(d).all() and torch.isfinite(grad_p).all() and torch.isfinite(grad_raw).all()


@pytest.mark.parametrize("regime", list(_maps()))
def test_divergence_of_a_point_with_itself_is_zero(regime):
    y = torch.cat([torch.logspace(-10, 0, 50), torch.tensor([0.0])])
    assert torch.equal(_maps()[regime].bregman(y, y), torch.zeros_like(y))


@pytest.mark.parametrize("transform", ["abs", "softplus"])
def test_convex_transforms_give_non_negative_divergence(transform):
    p, q = _probability_pairs()
    for seed in range(4):
        mirror_map = NeuralMirrorMap.from_vector(_vector(20 + seed, -1.0, 1.0), transform)
        assert (mirror_map.bregman(p.double(), q.double()) >= 0).all()
        assert (mirror_map.bregman(p, q) >= 0).all()


def test_none_transform_can_give_negative_divergence():
    """Documented behaviour: with negative parameters and transform 'none' the potential is not convex."""
    vector = _vector(30, 0.0, 1.0)
    vector[:126] *= -1.0  # negative output weights v_j
    vector[378:] *= -1.0  # negative a and c
    mirror_map = NeuralMirrorMap.from_vector(vector, "none")
    assert (mirror_map.bregman(torch.tensor([0.9]), torch.tensor([0.1])) < 0).all()


def _smooth_point_map() -> NeuralMirrorMap:
    return NeuralMirrorMap.from_vector(_vector(40, -1.0, 1.0).double(), "none")


def test_gradcheck_with_respect_to_p():
    mirror_map = _smooth_point_map()
    generator = torch.Generator().manual_seed(0)
    p = (torch.rand(12, generator=generator, dtype=torch.float64) * 0.9 + 0.05).requires_grad_(True)
    q = torch.rand(12, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    assert torch.autograd.gradcheck(lambda x: mirror_map.bregman(x, q), (p,))
    assert torch.autograd.gradcheck(lambda x: mirror_map.bregman(x, q), (q.clone().requires_grad_(True),))


def test_gradcheck_with_respect_to_map_parameters():
    generator = torch.Generator().manual_seed(1)
    p = torch.rand(6, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    q = torch.rand(6, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    vector = _vector(41, -1.0, 1.0).double()
    for transform in ("softplus",):  # "none" is the same graph minus the transform
        mirror_map = NeuralMirrorMap.from_vector(vector, transform)

        def divergence(raw, mirror_map=mirror_map):
            return torch.func.functional_call(mirror_map, {"raw": raw}, (p, q))

        assert torch.autograd.gradcheck(divergence, (vector.clone().requires_grad_(True),))


def test_gradient_reaches_raw_parameter_when_enabled():
    mirror_map = NeuralMirrorMap.random_init(0).requires_grad_(True)
    mirror_map.bregman(torch.tensor([0.2, 0.9]), torch.tensor([0.5, 0.1])).sum().backward()
    assert mirror_map.raw.grad is not None and (mirror_map.raw.grad != 0).any()
