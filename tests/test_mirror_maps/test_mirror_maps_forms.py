"""Sampled, importance-weighted and full-vocabulary forms, and the KL estimators."""

from __future__ import annotations

import pytest
import torch

from mirror_maps import (
    KL,
    NeuralMirrorMap,
    ProbL2,
    VECTOR_LENGTH,
    full_divergence,
    kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    sampled_divergence,
)


def _logits(*shape: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def test_full_kl_equals_kl_of_softmaxes():
    logits, ref = _logits(2, 5, 300, seed=0), _logits(2, 5, 300, seed=1)
    logp, logq = torch.log_softmax(logits, -1), torch.log_softmax(ref, -1)
    expected = (logp.exp() * (logp - logq)).sum(-1)
    torch.testing.assert_close(full_divergence(KL(), logits, ref), expected, rtol=1e-12, atol=1e-14)


def test_full_kl_is_accurate_for_nearly_equal_distributions_in_float32():
    """Terms are all >= 0, so a tiny KL over a large vocabulary is not lost to cancellation."""
    ref = _logits(4, 50_000, seed=2).float()
    logits = ref + 1e-3 * _logits(4, 50_000, seed=3, scale=1.0).float()
    exact = full_divergence(KL(), logits.double(), ref.double())
    assert torch.allclose(full_divergence(KL(), logits, ref).double(), exact, rtol=1e-3)


def test_full_prob_l2_is_half_squared_distance():
    logits, ref = _logits(3, 4, 100, seed=4), _logits(3, 4, 100, seed=5)
    p, q = torch.softmax(logits, -1), torch.softmax(ref, -1)
    torch.testing.assert_close(full_divergence(ProbL2(), logits, ref), 0.5 * ((p - q) ** 2).sum(-1))


def test_full_neural_map_with_only_c_equals_kl():
    vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    vector[379] = 1.0
    logits, ref = _logits(2, 3, 200, seed=6), _logits(2, 3, 200, seed=7)
    torch.testing.assert_close(
        full_divergence(NeuralMirrorMap.from_vector(vector, "none"), logits, ref), full_divergence(KL(), logits, ref)
    )


def test_full_neural_map_equals_sum_of_elementwise_terms():
    mirror_map = NeuralMirrorMap.random_init(5, scale=0.5, dtype=torch.float64)
    logits, ref = _logits(2, 3, 64, seed=8), _logits(2, 3, 64, seed=9)
    expected = mirror_map.bregman(torch.softmax(logits, -1), torch.softmax(ref, -1)).sum(-1)
    torch.testing.assert_close(full_divergence(mirror_map, logits, ref), expected, rtol=1e-10, atol=1e-14)


def _full_form_regimes() -> dict[str, NeuralMirrorMap]:
    generator = torch.Generator().manual_seed(17)
    signed = torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * 2 - 1
    near_kinks = signed.abs()
    near_kinks[252 + 42 : 252 + 105 : 3] = 0.0  # b = 0: kink at y = 0, no Taylor series
    near_kinks[252 + 43 : 252 + 105 : 3] = -near_kinks[126 + 43 : 126 + 105 : 3] * 5e-4  # kink inside (0, 1e-3)
    return {
        "authors_init": NeuralMirrorMap.random_init(42, param_transform="none", dtype=torch.float64),
        "signed_none": NeuralMirrorMap.from_vector(signed, "none"),
        "near_kinks": NeuralMirrorMap.from_vector(near_kinks, "none"),
    }


@pytest.mark.parametrize("regime", list(_full_form_regimes()))
def test_full_form_fast_path_matches_exact_elementwise_sum(regime):
    """The full form's Taylor shortcut for tiny probabilities agrees with the exact per-neuron formulas."""
    mirror_map = _full_form_regimes()[regime]
    logits = _logits(2, 2, 3000, seed=18, scale=2.0)  # every p > 1e-10, so bregman's clamp is inactive
    ref = logits + _logits(2, 2, 3000, seed=19, scale=0.5)
    ref[..., :10] = logits[..., :10]  # some entries with p == q
    p, q = torch.softmax(logits, -1), torch.softmax(ref, -1)
    assert ((p > 2**-10) | (q > 2**-10)).any() and ((p < 1e-6) & (q < 1e-6)).any() and (p.min() > 1e-10)
    exact_terms = mirror_map.bregman(p, q)
    torch.testing.assert_close(full_divergence(mirror_map, logits, ref), exact_terms.sum(-1), rtol=1e-12, atol=1e-18)
    fast32 = full_divergence(mirror_map, logits.float(), ref.float()).double()
    reference32 = mirror_map.bregman(
        torch.softmax(logits.float(), -1).double(), torch.softmax(ref.float(), -1).double()
    ).sum(-1)
    assert torch.allclose(fast32, reference32, rtol=1e-5, atol=1e-7)
    logits.requires_grad_(True)
    fast_grad = torch.autograd.grad(full_divergence(mirror_map, logits, ref).sum(), logits)[0]
    exact_grad = torch.autograd.grad(mirror_map.bregman(torch.softmax(logits, -1), q).sum(), logits)[0]
    torch.testing.assert_close(fast_grad, exact_grad, rtol=1e-9, atol=1e-15)


def test_default_chunk_comes_from_the_device_budget_and_never_exceeds_the_logits():
    """Whole rows per chunk from the budget (CPU 256 MiB, CUDA 2 GiB), and the budget at most the logits' own bytes:
    a small call's work stays a small multiple of its inputs."""
    from mirror_maps.forms import (_MIN_WORK_BYTES, _ROW_TENSORS, FULL_FORM_CHUNK_BYTES, FULL_FORM_CUDA_CHUNK_BYTES,
                                   _auto_chunk_size, _work_bytes)

    assert _auto_chunk_size(151_936, 4, FULL_FORM_CHUNK_BYTES) == 110
    cuda_chunk = _auto_chunk_size(151_936, 4, FULL_FORM_CUDA_CHUNK_BYTES)
    assert cuda_chunk > 110 and cuda_chunk * 151_936 * 4 * _ROW_TENSORS <= FULL_FORM_CUDA_CHUNK_BYTES
    assert _auto_chunk_size(10**9, 8, FULL_FORM_CUDA_CHUNK_BYTES) == 1
    assert _work_bytes(torch.empty(1024, 151_936)) == FULL_FORM_CHUNK_BYTES
    assert _work_bytes(torch.empty(32, 151_936)) == 32 * 151_936 * 4
    assert _work_bytes(torch.empty(2, 8)) == _MIN_WORK_BYTES


@pytest.mark.parametrize("chunk_size", [1, 4, 100])
def test_chunking_changes_neither_value_nor_gradient(chunk_size):
    mirror_map = NeuralMirrorMap.random_init(9, scale=0.3, dtype=torch.float64)
    logits = _logits(3, 5, 40, seed=10).requires_grad_(True)
    ref = _logits(3, 5, 40, seed=11)
    weights = _logits(3, 5, seed=12)
    whole = full_divergence(mirror_map, logits, ref, chunk_size=15)
    (whole_grad,) = torch.autograd.grad((whole * weights).sum(), logits)
    chunked = full_divergence(mirror_map, logits, ref, chunk_size=chunk_size)
    (chunked_grad,) = torch.autograd.grad((chunked * weights).sum(), logits)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(chunked_grad, whole_grad)


def test_sampled_form_is_the_clamped_elementwise_term():
    mirror_map = NeuralMirrorMap.random_init(1)
    logp = torch.log(torch.tensor([[0.3, 1e-12, 0.9]]))
    ref_logp = torch.log(torch.tensor([[0.5, 0.2, 1e-20]]))
    expected = mirror_map.bregman(torch.tensor([[0.3, 1e-10, 0.9]]), torch.tensor([[0.5, 0.2, 1e-10]]))
    torch.testing.assert_close(sampled_divergence(mirror_map, logp, ref_logp, form="sampled"), expected)
    torch.testing.assert_close(
        sampled_divergence(mirror_map, logp, ref_logp, form="sampled_is"), expected / torch.tensor([[0.3, 1e-10, 0.9]])
    )


@pytest.mark.parametrize("potential", [KL(), ProbL2(), NeuralMirrorMap.random_init(2, scale=0.5, dtype=torch.float64)])
def test_importance_weighted_form_is_unbiased_in_value_and_gradient(potential):
    """Averaging the single-token estimate over tokens drawn from pi gives the full form and its gradient."""
    theta = _logits(7, seed=13, scale=1.0).requires_grad_(True)
    ref = _logits(7, seed=14, scale=1.0)
    full = full_divergence(potential, theta.unsqueeze(0), ref.unsqueeze(0))[0]
    logp = torch.log_softmax(theta, -1)
    estimate = sampled_divergence(potential, logp, torch.log_softmax(ref, -1), form="sampled_is")
    expectation = (logp.exp().detach() * estimate).sum()  # exact average over the sampled token
    torch.testing.assert_close(expectation, full)
    torch.testing.assert_close(torch.autograd.grad(expectation, theta)[0], torch.autograd.grad(full, theta)[0])


def test_kl_estimators_match_their_formulas_and_expectations():
    logits, ref = _logits(9, seed=15, scale=1.0), _logits(9, seed=16, scale=1.0)
    logp, logq = torch.log_softmax(logits, -1), torch.log_softmax(ref, -1)
    ratio = torch.exp(logq - logp)
    torch.testing.assert_close(kl_k1(logp, logq), -torch.log(ratio))
    torch.testing.assert_close(kl_k2(logp, logq), 0.5 * torch.log(ratio) ** 2)
    torch.testing.assert_close(kl_k3(logp, logq), ratio - 1 - torch.log(ratio))
    exact_kl = full_divergence(KL(), logits.unsqueeze(0), ref.unsqueeze(0))[0]
    for name in ("k1", "k3"):
        torch.testing.assert_close((logp.exp() * kl_estimator(logp, logq, name)).sum(), exact_kl)
    assert torch.equal(kl_estimator(logp, logq, "k2"), kl_k2(logp, logq))


def test_k3_is_accurate_near_ratio_one_in_float32():
    logp = torch.full((5,), -2.0)
    ref_logp = logp + torch.tensor([1e-7, -3e-6, 1e-4, -2e-3, 0.3])
    exact = kl_k3(logp.double(), ref_logp.double())
    torch.testing.assert_close(kl_k3(logp, ref_logp).double(), exact, rtol=1e-5, atol=0)


def test_bad_arguments_are_rejected():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="form"):
        sampled_divergence(KL(), logp, logp, form="full")
    with pytest.raises(ValueError, match="shape"):
        sampled_divergence(KL(), logp, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="estimator"):
        kl_estimator(logp, logp, "k4")
    with pytest.raises(ValueError, match="chunk_size"):
        full_divergence(KL(), torch.zeros(1, 2, 5), torch.zeros(1, 2, 5), chunk_size=0)
    with pytest.raises(ValueError, match="shape"):
        full_divergence(KL(), torch.zeros(1, 2, 5), torch.zeros(1, 2, 6))
