"""The divergences on a CUDA device: same values and gradients as on the CPU, and nothing leaves the device.

The CPU suites pin the numerics down; this module checks that the CUDA kernels torch picks (exp, log,
pow, log1p, the fused path's plan built from device-side min/max) reproduce them, that the forms work
unchanged on CUDA tensors, and that no result or gradient is silently moved to the host. CI has no GPU,
so every test here is skipped, with the reason shown by `-ra`, when torch.cuda.is_available() is False.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import pytest
import torch

from mirror_maps import (
    KL,
    NeuralMirrorMap,
    Potential,
    ProbL2,
    SAMPLED_FORMS,
    VECTOR_LENGTH,
    full_divergence,
    kl_estimator,
    sampled_divergence,
)

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); the CPU paths are tested in the other "
    "tests/test_mirror_maps/test_mirror_maps_*.py modules",
)

DEVICE = torch.device("cuda")
"""Where the computation under test runs; the reference always runs on the CPU."""

TOLERANCES = {torch.float32: 1e-4, torch.float64: 1e-10}
"""Relative tolerance CUDA vs CPU per dtype. Each side is within ~1e-5 (float32) of float64 on these
inputs (tests/test_mirror_maps/test_mirror_maps_fused.py), and CUDA's libm differs from the CPU's by a few ulps."""


# ------------------------------------------------------------------------------------------- inputs
def _signed_vector() -> torch.Tensor:
    """U(-1, 1) parameters used as given: kinks inside [0, 1] and cancelling neurons, the exact branches."""
    generator = torch.Generator().manual_seed(11)
    return torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * 2 - 1


def _potentials(dtype: torch.dtype) -> dict[str, Callable[[], Potential]]:
    """Fresh CPU potentials by name; neural maps in `dtype`, with their vector fixed (fused path)."""
    return {
        "kl": KL,
        "prob_l2": ProbL2,
        "neural_authors_init": lambda: NeuralMirrorMap.random_init(42, dtype=dtype),
        "neural_signed_none": lambda: NeuralMirrorMap.from_vector(_signed_vector().to(dtype), "none"),
    }


def _log_probs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[8, 513] sampled-token log-probs: p from 1e-9 to 1, q independent for half the rows, a few ulps to
    1e-2 away from p for the other half (where a Bregman divergence cancels). 4,104 tokens: several of the
    fused path's chunks."""
    generator = torch.Generator().manual_seed(5)
    p = 10 ** (-9 * torch.rand(8, 513, generator=generator, dtype=torch.float64))
    q = 10 ** (-9 * torch.rand(8, 513, generator=generator, dtype=torch.float64))
    relative = torch.logspace(-7, -2, 513, dtype=torch.float64)
    q[4:] = (p[4:] * (1 - relative)).clamp_min(1e-12)
    return torch.log(p).to(dtype), torch.log(q).to(dtype)


def _logits(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, 3, 3000] logits, the reference a perturbation of the policy: most entries below the full form's
    Taylor threshold (1e-3), some above it."""
    generator = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 3000, generator=generator, dtype=torch.float64) * 3
    ref_logits = logits + 0.5 * torch.randn(2, 3, 3000, generator=generator, dtype=torch.float64)
    return logits.to(dtype), ref_logits.to(dtype)


# ------------------------------------------------------------------------------------------- helpers
def _on(potential: Potential, device: torch.device) -> Potential:
    """Neural maps are modules and move with .to(); KL and ProbL2 hold no tensors."""
    return potential.to(device) if isinstance(potential, torch.nn.Module) else potential


def _differentiate(
    function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> list[torch.Tensor]:
    """[value, d loss/dx, d loss/dy] for loss = sum(w * f(x, y)) with fixed pseudo-random weights w, so a
    wrong gradient cannot hide behind a symmetric sum. The weights are drawn in float64 (torch.rand draws
    different numbers per dtype) so results in two dtypes are comparable."""
    x = x.detach().clone().requires_grad_(True)
    y = y.detach().clone().requires_grad_(True)
    value = function(x, y)
    weights = torch.rand(value.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad_x, grad_y = torch.autograd.grad((value * weights.to(value.device, value.dtype)).sum(), [x, y])
    return [value.detach(), grad_x, grad_y]


def _cpu_reference(
    make: Callable[[torch.dtype], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """CPU results in x's dtype, and for float32 how far each entry is from the float64 CPU result.

    A device may differ from the CPU by the CPU's own rounding error and no more. Where float32 is
    ill-conditioned (KL's sampled_is gradient at p << q is off by ~1e-7 absolute in dd/dp, then divided
    by p) that error is large, and CUDA is allowed the same slack rather than failing on CPU-side noise.
    """
    expected = _differentiate(make(x.dtype), x, y)
    if x.dtype == torch.float64:
        return expected, [torch.zeros_like(t) for t in expected]
    exact = _differentiate(make(torch.float64), x.double(), y.double())
    return expected, [(a.double() - b).abs() for a, b in zip(expected, exact)]


def _assert_matches_cpu(
    name: str, on_device: list[torch.Tensor], on_cpu: list[torch.Tensor], cpu_error: list[torch.Tensor]
) -> None:
    """Each CUDA result stays on the device and equals the CPU one within the dtype's tolerance plus twice
    the CPU's own rounding error (`cpu_error`, zero in float64).

    The absolute part is relative to the largest entry: entries where d cancels (p close to q) are ~1e-12
    of it, and a few ulps of an intermediate there is not a device discrepancy.
    """
    for label, actual, expected, slack in zip(("value", "grad x", "grad y"), on_device, on_cpu, cpu_error):
        assert actual.device.type == DEVICE.type, f"{name} {label} came back on {actual.device}"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert torch.isfinite(actual).all(), f"{name} {label}: not finite on {DEVICE}"
        rtol = TOLERANCES[expected.dtype]
        error = (actual.cpu().double() - expected.double()).abs()
        allowed = rtol * expected.double().abs() + rtol * 0.1 * float(expected.abs().max()) + 2 * slack
        worst = int(torch.argmax(error / allowed.clamp_min(1e-300)))
        logger.info("%s %s: max |cuda - cpu| = %.3g, worst error / allowed = %.3g",
                    name, label, float(error.max()), float(error.flatten()[worst] / allowed.flatten()[worst]))
        assert bool((error <= allowed).all()), (
            f"{name} {label}: {DEVICE} {actual.flatten()[worst].item()!r} vs cpu {expected.flatten()[worst].item()!r} "
            f"at flat index {worst} (allowed {allowed.flatten()[worst].item():.3g})"
        )


# ------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("form", SAMPLED_FORMS)
@pytest.mark.parametrize("potential", list(_potentials(torch.float32)))
def test_sampled_form_matches_cpu(potential: str, form: str, dtype: torch.dtype) -> None:
    """sampled_divergence and its gradients w.r.t. both log-probs, CUDA vs CPU (neural: the fused path)."""
    logp, ref_logp = _log_probs(dtype)

    def make(work_dtype: torch.dtype, device: torch.device = torch.device("cpu")):
        mirror = _on(_potentials(work_dtype)[potential](), device)
        return lambda x, y: sampled_divergence(mirror, x, y, form=form)

    expected, cpu_error = _cpu_reference(make, logp, ref_logp)
    actual = _differentiate(make(dtype, DEVICE), logp.to(DEVICE), ref_logp.to(DEVICE))
    if potential == "kl" and form == "sampled_is":
        # KL's d/dp comes from autograd through the product form of p log(p/q) - p + q, whose absolute
        # error is ~eps * q/p; sampled_is divides it by p (the 1/p weight is detached), so where q >> p
        # the gradient is rounding noise on every device (float32 CPU at p = 1e-9, q = 0.9: +76 for an exact
        # -20.6). That is not a CUDA property: compare d/dlogp only where q/p <= 1e3 (error <= ~1e3 eps).
        conditioned = (ref_logp - logp).double() <= math.log(1e3)
        assert conditioned.double().mean() > 0.5, "too few well-conditioned entries left to compare"
        actual[1] = torch.where(conditioned.to(DEVICE), actual[1], torch.zeros_like(actual[1]))
        expected[1] = torch.where(conditioned, expected[1], torch.zeros_like(expected[1]))
        cpu_error[1] = torch.where(conditioned, cpu_error[1], torch.zeros_like(cpu_error[1]))
    _assert_matches_cpu(f"{potential}/{form}/{dtype}", actual, expected, cpu_error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fixed_map_runs_the_fused_function_and_agrees_with_autograd_path(dtype: torch.dtype) -> None:
    """A fixed map's bregman is the fused autograd.Function on CUDA too; a trainable one goes through
    autograd. The fused d and gradients in `dtype` match the autograd path in float64, on the device.

    Bounds as in tests/test_mirror_maps/test_mirror_maps_fused.py: the autograd path's own float64 rounding is ~1e-8
    relative; the fused float32 result is within 1e-5 relative or 1e-7 absolute of float64 (authors' init).
    """
    logp, ref_logp = _log_probs(torch.float64)
    p, q = logp.exp().to(DEVICE), ref_logp.exp().to(DEVICE)
    fixed = NeuralMirrorMap.random_init(42, dtype=dtype).to(DEVICE)
    trainable = NeuralMirrorMap.random_init(42, dtype=torch.float64).to(DEVICE).requires_grad_(True)
    probe = fixed.bregman(p.to(dtype).requires_grad_(True), q.to(dtype))
    assert "NeuralBregman" in type(probe.grad_fn).__name__, f"fixed map did not take the fused path: {probe.grad_fn}"
    assert "NeuralBregman" not in type(trainable.bregman(p.clone().requires_grad_(True), q).grad_fn).__name__
    fast = _differentiate(fixed.bregman, p.to(dtype), q.to(dtype))
    slow = _differentiate(trainable.bregman, p, q)
    for label, a, b in zip(("value", "grad p", "grad q"), fast, slow):
        assert a.device.type == b.device.type == DEVICE.type
        error = (a.double() - b).abs()
        if dtype == torch.float64:
            ok = error <= 1e-6 * b.abs() + 1e-12
        else:
            ok = (error <= 1e-5 * b.abs()) | (error <= 1e-7)
        worst = int(torch.argmax(torch.where(ok, 0.0, error)))
        assert bool(ok.all()), (f"{dtype} {label}: fused {a.flatten()[worst].item()!r} vs autograd float64 "
                                f"{b.flatten()[worst].item()!r} at p={p.flatten()[worst].item()!r}, "
                                f"q={q.flatten()[worst].item()!r}")


def test_trainable_map_vector_gradient_matches_cpu() -> None:
    """Differentiating w.r.t. the map's own vector (the autograd path) gives the CPU gradient on CUDA."""
    logp, ref_logp = _log_probs(torch.float64)
    grads = []
    for device in (torch.device("cpu"), DEVICE):
        mirror_map = NeuralMirrorMap.random_init(42, dtype=torch.float64).to(device).requires_grad_(True)
        loss = sampled_divergence(mirror_map, logp.to(device), ref_logp.to(device), form="sampled").sum()
        (grad,) = torch.autograd.grad(loss, [mirror_map.raw])
        assert grad.device.type == device.type
        grads.append(grad)
    torch.testing.assert_close(grads[1].cpu(), grads[0], rtol=1e-10, atol=1e-10 * float(grads[0].abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("potential", list(_potentials(torch.float32)))
def test_full_form_matches_cpu(potential: str, dtype: torch.dtype) -> None:
    """full_divergence with gradients w.r.t. both logits; chunk_size=2 so the checkpointed chunks and the
    Taylor / exact split all run on the device."""
    logits, ref_logits = _logits(dtype)

    def make(work_dtype: torch.dtype, device: torch.device = torch.device("cpu")):
        mirror = _on(_potentials(work_dtype)[potential](), device)
        return lambda x, y: full_divergence(mirror, x, y, chunk_size=2)

    expected, cpu_error = _cpu_reference(make, logits, ref_logits)
    actual = _differentiate(make(dtype, DEVICE), logits.to(DEVICE), ref_logits.to(DEVICE))
    _assert_matches_cpu(f"full/{potential}/{dtype}", actual, expected, cpu_error)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_cpu(estimator: str) -> None:
    logp, ref_logp = _log_probs(torch.float32)

    def make(_: torch.dtype):
        return lambda x, y: kl_estimator(x, y, estimator)

    expected, cpu_error = _cpu_reference(make, logp, ref_logp)
    actual = _differentiate(make(torch.float32), logp.to(DEVICE), ref_logp.to(DEVICE))
    _assert_matches_cpu(f"kl_{estimator}", actual, expected, cpu_error)


def test_computation_stays_on_the_device() -> None:
    """A map moved to CUDA keeps its parameters there, and every form returns device tensors whose
    gradients are device tensors: no hidden host copy of a result a training step would then move back."""
    mirror_map = NeuralMirrorMap.random_init(42).to(DEVICE)
    assert mirror_map.raw.device.type == DEVICE.type
    assert all(t.device.type == DEVICE.type for t in mirror_map.parameters_for(torch.float32))
    logp, ref_logp = (t.to(DEVICE) for t in _log_probs(torch.float32))
    logits, ref_logits = (t.to(DEVICE) for t in _logits(torch.float32))
    x = logp.clone().requires_grad_(True)
    z = logits.clone().requires_grad_(True)
    outputs = [sampled_divergence(mirror_map, x, ref_logp, form=form) for form in SAMPLED_FORMS]
    outputs += [full_divergence(potential, z, ref_logits) for potential in (mirror_map, KL(), ProbL2())]
    outputs += [mirror_map.h(logp.exp()), mirror_map.h_prime(logp.exp()), kl_estimator(x, ref_logp)]
    for output in outputs:
        assert output.device.type == DEVICE.type
    torch.autograd.backward([output.sum() for output in outputs if output.requires_grad])
    assert x.grad is not None and x.grad.device.type == DEVICE.type
    assert z.grad is not None and z.grad.device.type == DEVICE.type
    assert torch.isfinite(x.grad).all() and torch.isfinite(z.grad).all()
    torch.cuda.synchronize()
