"""Potentials' closed forms, the 380-vector layout and the parameter transforms."""

from __future__ import annotations

import pytest
import torch

from mirror_maps import KL, NeuralMirrorMap, ProbL2, VECTOR_LENGTH
from mirror_maps.neurons import NEURONS_PER_BLOCK


def _only(**values: float) -> torch.Tensor:
    vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    for name, value in values.items():
        vector[{"a": 378, "c": 379}[name]] = value
    return vector


P = torch.tensor([1e-10, 1e-4, 0.2, 0.5, 0.5, 0.99, 1.0], dtype=torch.float64)
Q = torch.tensor([0.3, 1e-4 * (1 + 1e-9), 0.7, 0.5, 0.25, 1e-10, 0.4], dtype=torch.float64)


def test_kl_term_is_generalized_kl():
    expected = P * torch.log(P / Q) - P + Q
    torch.testing.assert_close(KL().bregman(P, Q), expected, rtol=1e-6, atol=1e-15)


def test_prob_l2_has_the_half():
    torch.testing.assert_close(ProbL2().bregman(P, Q), 0.5 * (P - Q) ** 2, rtol=1e-14, atol=0)


@pytest.mark.parametrize("a", [1.0, 2.5])
def test_map_with_only_a_is_scaled_prob_l2(a):
    mirror_map = NeuralMirrorMap.from_vector(_only(a=a), "none")
    torch.testing.assert_close(mirror_map.bregman(P, Q), a * 0.5 * (P - Q) ** 2, rtol=1e-14, atol=0)


def test_map_with_only_c_is_generalized_kl():
    mirror_map = NeuralMirrorMap.from_vector(_only(c=1.0), "none")
    torch.testing.assert_close(mirror_map.bregman(P, Q), KL().bregman(P, Q), rtol=1e-14, atol=0)


@pytest.mark.parametrize("potential", [KL(), ProbL2(), NeuralMirrorMap.random_init(3, scale=1.0, dtype=torch.float64)])
def test_bregman_equals_definition_and_h_prime_is_the_derivative(potential):
    p = torch.linspace(0.05, 1.0, 17, dtype=torch.float64)
    q = torch.linspace(1.0, 0.1, 17, dtype=torch.float64)
    definition = potential.h(p) - potential.h(q) - potential.h_prime(q) * (p - q)
    torch.testing.assert_close(potential.bregman(p, q), definition, rtol=1e-9, atol=1e-13)
    y = p.clone().requires_grad_(True)
    (derivative,) = torch.autograd.grad(potential.h(y).sum(), y)
    torch.testing.assert_close(derivative, potential.h_prime(p), rtol=1e-10, atol=1e-12)


def test_elementwise_on_any_shape():
    mirror_map = NeuralMirrorMap.random_init(0)
    p = torch.rand(2, 3, 4)
    q = torch.rand(2, 3, 4)
    for potential in (KL(), ProbL2(), mirror_map):
        for method in (potential.h, potential.h_prime):
            assert method(p).shape == (2, 3, 4)
        d = potential.bregman(p, q)
        assert d.shape == (2, 3, 4)
        torch.testing.assert_close(d[1, 2], potential.bregman(p[1, 2], q[1, 2]))


def test_vector_round_trip_and_layout():
    vector = torch.randn(VECTOR_LENGTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mirror_map = NeuralMirrorMap.from_vector(vector, "none")
    assert torch.equal(mirror_map.to_vector(), vector)
    v, w, b, a, c = mirror_map.parameters_for(torch.float64)
    assert torch.equal(v, vector[:126]) and torch.equal(w, vector[126:252]) and torch.equal(b, vector[252:378])
    assert a.item() == vector[378].item() and c.item() == vector[379].item()


def test_block_order_matches_the_spec():
    """Neuron j of the second block is u^2: a single v=w=1, b=0 neuron there gives H(y) = y^3 / 3."""
    vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    y = torch.tensor([0.3, 0.8], dtype=torch.float64)
    expected_h_prime = [y**3, y**2, y.sqrt(), y ** (1 / 3), torch.log(y + 1e-3), torch.exp(y)]
    for block, expected in enumerate(expected_h_prime):
        vector.zero_()
        vector[block * NEURONS_PER_BLOCK] = 1.0
        vector[126 + block * NEURONS_PER_BLOCK] = 1.0
        torch.testing.assert_close(NeuralMirrorMap.from_vector(vector, "none").h_prime(y), expected)


def test_transforms_are_applied_when_reading():
    vector = torch.full((VECTOR_LENGTH,), -0.5, dtype=torch.float64)
    as_given = NeuralMirrorMap.from_vector(vector, "none").parameters_for(torch.float64)[0]
    absolute = NeuralMirrorMap.from_vector(vector, "abs").parameters_for(torch.float64)[0]
    softplus = NeuralMirrorMap.from_vector(vector, "softplus").parameters_for(torch.float64)[0]
    assert (as_given == -0.5).all() and (absolute == 0.5).all()
    torch.testing.assert_close(softplus, torch.log1p(torch.exp(torch.tensor(-0.5, dtype=torch.float64))).expand(126))
    assert torch.equal(NeuralMirrorMap.from_vector(vector, "abs").to_vector(), vector)


def test_default_transform_is_abs():
    assert NeuralMirrorMap.from_vector(torch.zeros(VECTOR_LENGTH)).param_transform == "abs"


def test_random_init_is_uniform_local_and_reproducible():
    state = torch.random.get_rng_state()
    first = NeuralMirrorMap.random_init(42).to_vector()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(first, NeuralMirrorMap.random_init(42).to_vector())
    assert not torch.equal(first, NeuralMirrorMap.random_init(43).to_vector())
    assert first.shape == (VECTOR_LENGTH,) and (first >= 0).all() and (first < 0.01).all()
    assert first.mean().item() == pytest.approx(0.005, abs=0.001)
    assert (NeuralMirrorMap.random_init(1, scale=2.0).to_vector() < 2.0).all()


@pytest.mark.parametrize(
    "vector, message",
    [
        (torch.zeros(379), "shape"),
        (torch.zeros(2, 190), "shape"),
        (torch.zeros(VECTOR_LENGTH, dtype=torch.int64), "floating"),
        (torch.full((VECTOR_LENGTH,), float("nan")), "NaN"),
    ],
)
def test_bad_vectors_are_rejected(vector, message):
    with pytest.raises(ValueError, match=message):
        NeuralMirrorMap.from_vector(vector)


def test_unknown_transform_is_rejected():
    with pytest.raises(ValueError, match="param_transform"):
        NeuralMirrorMap.from_vector(torch.zeros(VECTOR_LENGTH), "relu")
