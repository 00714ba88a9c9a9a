"""The fixed-map fast path (mirror_maps.fused): same values and gradients as autograd, accurate in float32."""

from __future__ import annotations

import pytest
import torch

from mirror_maps import NeuralMirrorMap, VECTOR_LENGTH, sampled_divergence, fused


def _vector(seed: int, low: float, high: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * (high - low) + low


def _maps() -> dict[str, NeuralMirrorMap]:
    """Regimes hitting every path: series-only and closed-form exp/log, kinks inside the data, clamped."""
    tiny_w = _vector(1, 0.0, 0.01)
    tiny_w[126:252] *= torch.logspace(-12, -4, 126, dtype=torch.float64)
    kinked = _vector(2, 0.1, 1.0)
    kinked[252 + 42 : 252 + 105] = -kinked[126 + 42 : 126 + 105] * torch.linspace(0.05, 0.95, 63, dtype=torch.float64)
    large = _vector(3, 0.0, 1.0)
    large[126:252] *= 8.0  # |w| (p - q) beyond the exp series bound
    clamped = _vector(4, 0.1, 1.0)
    clamped[252 + 42 : 252 + 105] = -2.0  # sqrt, cbrt and log neurons clamped on all of [0, 1]
    log_only = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    log_block = slice(84, 105)
    log_only[log_block] = 1.0  # v
    log_only[126:252][log_block] = torch.linspace(1.0, 8.0, 21, dtype=torch.float64)  # w
    log_only[252:378][log_block] = 1e-6  # b: x_p / x_q down to ~1e-4 when p << q
    return {
        "log_far_ratio": NeuralMirrorMap.from_vector(log_only.float(), "none"),
        "authors_init": NeuralMirrorMap.random_init(42, param_transform="none"),
        "signed_none": NeuralMirrorMap.from_vector(_vector(5, -1.0, 1.0).float(), "none"),
        "tiny_w": NeuralMirrorMap.from_vector(tiny_w.float(), "none"),
        "kinks_inside_unit_interval": NeuralMirrorMap.from_vector(kinked.float(), "none"),
        "large_w": NeuralMirrorMap.from_vector(large.float(), "abs"),
        "clamped": NeuralMirrorMap.from_vector(clamped.float(), "none"),
    }


def _pairs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A log grid over [1e-10, 1]^2, plus q within a few float32 ulps, 1e-4 and 1e-2 of p, plus p = q."""
    grid = torch.logspace(-10, 0, 25)
    p_grid, q_grid = (t.flatten() for t in torch.meshgrid(grid, grid, indexing="ij"))
    base = torch.cat([torch.logspace(-10, 0, 41), torch.linspace(0.05, 1.0, 20)])
    near = [base * (1 - k * 6e-8) for k in (1, 3, 17)] + [base * (1 - 1e-4), base * (1 - 1e-2), base]
    p = torch.cat([p_grid] + [base] * len(near))
    q = torch.cat([q_grid] + near)
    return p.to(dtype), q.to(dtype)


def _value_and_grads(mirror_map: NeuralMirrorMap, p: torch.Tensor, q: torch.Tensor):
    p = p.clone().requires_grad_(True)
    q = q.clone().requires_grad_(True)
    d = mirror_map.bregman(p, q)
    grad_p, grad_q = torch.autograd.grad(d.sum(), [p, q])
    return d.detach(), grad_p, grad_q


@pytest.mark.parametrize("regime", list(_maps()))
def test_fast_path_matches_autograd_path_in_float64(regime):
    """With the vector requiring grad, bregman takes the autograd path: both must agree in value and grads."""
    fixed = _maps()[regime]
    trainable = NeuralMirrorMap.from_vector(fixed.to_vector(), fixed.param_transform).requires_grad_(True)
    p, q = _pairs(torch.float64)
    fast = _value_and_grads(fixed, p, q)
    slow = _value_and_grads(trainable, p, q)
    # The autograd path's own float64 rounding (through its branch-safe formulas) is ~1e-8 relative.
    for name, a, b in zip(("d", "dd/dp", "dd/dq"), fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12, msg=lambda m, name=name: f"{regime} {name}: {m}")


@pytest.mark.parametrize("regime", list(_maps()))
def test_fast_gradient_is_h_prime_difference(regime):
    """dd/dp = h'(p) - h'(q); in float64 the plain difference is exact to ~1e-16 of |h'|, a sharp reference."""
    mirror_map = _maps()[regime]
    p, q = _pairs(torch.float64)
    _, grad_p, _ = _value_and_grads(mirror_map, p, q)
    h_p, h_q = mirror_map.h_prime(p), mirror_map.h_prime(q)
    assert ((grad_p - (h_p - h_q)).abs() <= 1e-11 * (h_p.abs() + h_q.abs()) + 1e-300).all()


@pytest.mark.parametrize("regime", list(_maps()))
def test_float32_gradients_match_float64(regime):
    """dd/dp = h'(p) - h'(q) is computed without cancellation, so it keeps its accuracy as q -> p.

    Value: 1e-5 relative or 1e-7 absolute, as everywhere. Gradients: the same, or within 1e-6 of the size of
    h' itself -- near a sqrt/cbrt kink, or when signed neurons cancel ("none"), rounding u = w y + b to
    float32 moves s(u) by a few ulps of |h'|, whatever the formula (the autograd path's float32 gradient
    is off by up to 1e3 on these same points).
    """
    mirror_map = _maps()[regime]
    p, q = _pairs()
    actual = _value_and_grads(mirror_map, p, q)
    expected = _value_and_grads(mirror_map, p.double(), q.double())
    scale = mirror_map.h_prime(p.double()).abs() + mirror_map.h_prime(q.double()).abs()
    for name, a, b in zip(("d", "dd/dp", "dd/dq"), actual, expected):
        error = (a.double() - b).abs()
        ok = (error <= 1e-5 * b.abs()) | (error <= 1e-7)
        if name != "d":
            ok |= error <= 1e-6 * scale
        worst = (~ok).nonzero().flatten()[:3].tolist()
        assert ok.all(), f"{regime} {name}: float32 off at p={p[worst].tolist()} q={q[worst].tolist()}"
    if regime in ("authors_init", "large_w", "tiny_w", "log_far_ratio"):  # no kinks, no signs: the strict bound holds
        for a, b in zip(actual[1:], expected[1:]):
            error = (a.double() - b).abs()
            assert ((error <= 1e-5 * b.abs()) | (error <= 1e-7)).all()


@pytest.mark.parametrize("transform", ["none", "abs", "softplus"])
def test_fast_path_finite_with_gradients_on_closed_unit_square(transform):
    grid = torch.cat([torch.tensor([0.0, 1e-45, 1e-30]), torch.logspace(-12, 0, 25), torch.linspace(0, 1, 11)])
    p, q = (t.flatten() for t in torch.meshgrid(grid, grid, indexing="ij"))
    for seed in range(3):
        mirror_map = NeuralMirrorMap.from_vector(_vector(10 + seed, -1.0, 1.0).float(), transform)
        d, grad_p, grad_q = _value_and_grads(mirror_map, p, q)
        assert torch.isfinite(d).all() and torch.isfinite(grad_p).all() and torch.isfinite(grad_q).all()


def test_chunking_does_not_change_the_result(monkeypatch):
    mirror_map = _maps()["kinks_inside_unit_interval"]
    p, q = _pairs()
    whole = _value_and_grads(mirror_map, p, q)
    monkeypatch.setattr(fused, "CHUNK_TOKENS", 37)  # many chunks, the last one partial
    chunked = _value_and_grads(mirror_map, p, q)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_chunk_size_depends_only_on_the_device_type():
    """The CPU keeps its cache-sized chunk; CUDA gets the launch-amortising one (no GPU needed to check)."""
    assert fused.chunk_tokens_for(torch.device("cpu")) == fused.CHUNK_TOKENS == 1536
    assert fused.chunk_tokens_for(torch.device("cuda", 0)) == fused.CUDA_CHUNK_TOKENS


def test_broadcast_inputs_get_reduced_gradients():
    mirror_map = _maps()["signed_none"].double()
    p = torch.linspace(0.1, 0.9, 5, dtype=torch.float64).requires_grad_(True)
    q = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: mirror_map.bregman(x.unsqueeze(0).expand(3, 5), y), (p, q))


def test_sampled_form_gradient_matches_autograd_path():
    """What a GRPO step differentiates: sampled_divergence w.r.t. the policy log-probs, both forms."""
    fixed = NeuralMirrorMap.random_init(7, dtype=torch.float64)
    trainable = NeuralMirrorMap.random_init(7, dtype=torch.float64).requires_grad_(True)
    generator = torch.Generator().manual_seed(3)
    logp = torch.log(torch.rand(4, 50, generator=generator, dtype=torch.float64))
    ref_logp = torch.log(torch.rand(4, 50, generator=generator, dtype=torch.float64))
    for form in ("sampled", "sampled_is"):
        grads = []
        for mirror_map in (fixed, trainable):
            x = logp.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(sampled_divergence(mirror_map, x, ref_logp, form=form).sum(), [x])
            grads.append(grad)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-14)


def test_empty_input():
    assert NeuralMirrorMap.random_init(0).bregman(torch.empty(0, 3), torch.empty(0, 3)).shape == (0, 3)
