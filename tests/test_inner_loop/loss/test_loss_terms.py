"""The GBMPO loss against hand computations on tiny batches: every host, regularizer, form and aggregation."""
from __future__ import annotations

import math

import pytest
import torch

from inner_loop.config import DivergenceConfig, divergence_config
from inner_loop.loss.compose import aggregate, compose_loss
from inner_loop.loss.policy_registry import POLICY_TERMS
from inner_loop.loss.policy_terms import PolicyInputs, PolicyParams
from inner_loop.loss.regularizers import build_regularizer
from mirror_maps import VECTOR_LENGTH, kl_estimator

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])  # 100 sits under padding and must never count


def test_aggregations_match_hand_computation():
    assert aggregate(VALUES, MASK, "dr_grpo", 4).item() == pytest.approx((1 + 2 + 3 + 4 + 5) / (2 * 4))
    assert aggregate(VALUES, MASK, "grpo", 4).item() == pytest.approx(((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2)
    assert aggregate(VALUES, MASK, "bnpo", 4).item() == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(VALUES, MASK, "mean", 4)


def _inputs(ratios: list[list[float]], advantages: list[float]) -> PolicyInputs:
    old = torch.log(torch.tensor([[0.5, 0.25, 0.4], [0.2, 0.6, 0.3]]))
    logps = (old + torch.log(torch.tensor(ratios))).requires_grad_(True)
    return PolicyInputs(logps=logps, old_logps=old, advantages=torch.tensor(advantages), mask=MASK)


def test_clip_term_clips_only_in_the_advantage_direction():
    inputs = _inputs([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]], [2.0, -1.0])
    out = POLICY_TERMS["clip"](inputs, PolicyParams(0.2, 0.3))
    # A > 0: ratio 1.5 clipped to 1.3, ratio 0.5 unclipped (min picks it); A < 0: 1.5 kept, 0.5 clipped to 0.8.
    expected = torch.tensor([[-1.3 * 2, -0.5 * 2, -1.0 * 2], [1.5, 0.8, 1.0]])
    torch.testing.assert_close(out.per_token_loss.detach(), expected)
    assert out.metrics["clip_ratio/high"] == pytest.approx(1 / 5)
    assert out.metrics["clip_ratio/low"] == pytest.approx(1 / 5)


def test_clip_term_gradient_raises_logp_of_positive_advantage_tokens():
    inputs = _inputs([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [1.0, -1.0])
    loss = aggregate(POLICY_TERMS["clip"](inputs, PolicyParams()).per_token_loss, MASK, "bnpo", 3)
    loss.backward()
    grad = inputs.logps.grad
    assert (grad[0] < 0).all() and (grad[1, :2] > 0).all() and grad[1, 2] == 0


def test_gspo_uses_the_sequence_mean_log_ratio():
    inputs = _inputs([[1.1, 1.2, 1.3], [0.9, 1.0, 7.0]], [1.0, -1.0])
    out = POLICY_TERMS["gspo"](inputs, PolicyParams(0.5, 0.5))
    s0 = math.exp((math.log(1.1) + math.log(1.2) + math.log(1.3)) / 3)
    s1 = math.exp((math.log(0.9) + math.log(1.0)) / 2)  # the padded 7.0 is ignored
    expected = torch.tensor([[-s0] * 3, [s1] * 3])
    torch.testing.assert_close(out.per_token_loss.detach(), expected)


P = torch.tensor([[0.5, 0.25, 0.4], [0.2, 0.6, 0.3]])
Q = torch.tensor([[0.4, 0.5, 0.4], [0.1, 0.6, 0.9]])


def _sampled_reference(name: str, form: str, estimator: str = "k3") -> torch.Tensor:
    """Hand formulas (docs/method.md §1-2) for the sampled token's divergence."""
    if name == "kl" and form == "sampled":
        log_r = torch.log(Q) - torch.log(P)
        return {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": torch.exp(log_r) - 1 - log_r}[estimator]
    if name in ("kl", "neural_mirror_c"):
        d = P * torch.log(P / Q) - P + Q
    else:  # prob_l2 and the neural map with only a = 1
        d = 0.5 * (P - Q) ** 2
    return d / P if form == "sampled_is" else d


def _neural_vector(a: float, c: float) -> list[float]:
    vector = [0.0] * VECTOR_LENGTH
    vector[-2], vector[-1] = a, c
    return vector


CASES = [
    ("kl", "sampled", "k1", None),
    ("kl", "sampled", "k2", None),
    ("kl", "sampled", "k3", None),
    ("kl", "sampled_is", "k3", None),
    ("prob_l2", "sampled", "k3", None),
    ("prob_l2", "sampled_is", "k3", None),
    ("neural_mirror", "sampled", "k3", (1.0, 0.0)),
    ("neural_mirror", "sampled_is", "k3", (1.0, 0.0)),
    ("neural_mirror_c", "sampled", "k3", (0.0, 1.0)),
    ("neural_mirror_c", "sampled_is", "k3", (0.0, 1.0)),
]


def _config(**node) -> DivergenceConfig:
    """The divergence node as its entry's config class; a learned map reads its vector untransformed."""
    return divergence_config(node | ({"param_transform": "none"} if node["name"] == "neural_mirror" else {}))


@pytest.mark.parametrize("aggregation", ["dr_grpo", "grpo", "bnpo"])
@pytest.mark.parametrize("name,form,estimator,neural", CASES)
def test_composed_loss_sampled_forms(name, form, estimator, neural, aggregation):
    real = "neural_mirror" if name.startswith("neural") else name
    cfg = _config(name=real, form=form, estimator=estimator, coef=0.3)
    reg = build_regularizer(cfg, _neural_vector(*neural) if neural else None)
    logps, ref = torch.log(P), torch.log(Q)
    inputs = PolicyInputs(logps=logps, old_logps=logps, advantages=torch.tensor([1.0, -2.0]), mask=MASK)
    d = reg.per_token(logps, ref)
    torch.testing.assert_close(d, _sampled_reference(name, form, estimator), rtol=1e-5, atol=1e-6)
    parts = compose_loss(inputs, PolicyParams(), "clip", d, 0.3, aggregation, 4)
    policy = -torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])  # ratio 1: -A per token
    expected = aggregate(policy + 0.3 * _sampled_reference(name, form, estimator), MASK, aggregation, 4)
    assert parts.loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    reg_value = aggregate(_sampled_reference(name, form, estimator), MASK, aggregation, 4).item()
    assert parts.regularizer_value == pytest.approx(reg_value, rel=1e-5, abs=1e-7)
    assert parts.regularizer_term.item() == pytest.approx(0.3 * reg_value, rel=1e-5, abs=1e-7)
    assert (parts.policy_term + parts.regularizer_term).item() == pytest.approx(parts.loss.item(), rel=1e-6)


@pytest.mark.parametrize("name,neural", [("kl", None), ("prob_l2", None), ("neural_mirror", (1.0, 0.0)),
                                         ("neural_mirror", (0.0, 1.0))])
def test_full_form_sums_over_the_vocabulary(name, neural):
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    cfg = _config(name=name, form="full", coef=1.0, chunk_size=2)
    reg = build_regularizer(cfg, _neural_vector(*neural) if neural else None)
    assert reg.needs_full_vocabulary
    p, q = torch.softmax(logits, -1), torch.softmax(ref_logits, -1)
    if name == "kl" or neural == (0.0, 1.0):
        expected = (p * torch.log(p / q)).sum(-1)
    else:
        expected = 0.5 * ((p - q) ** 2).sum(-1)
    got = reg.per_token(torch.zeros(2, 3), torch.zeros(2, 3), logits, ref_logits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="logits"):
        reg.per_token(torch.zeros(2, 3), torch.zeros(2, 3))


def test_training_takes_the_full_form_from_hidden_states_with_the_configured_chunk(monkeypatch):
    """Regularizer.full_from_hidden (what the trainer calls): the divergence of the heads' logits at the temperature
    and log p(y); divergence.chunk_size, when set, is the positions of a tile, else the caller's rows; the caller's
    budget caps the library's."""
    import mirror_maps.tiled as tiled

    torch.manual_seed(0)
    head, ref_head = torch.nn.Linear(4, 7), torch.nn.Linear(4, 7)
    hidden, ref_hidden, targets = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randint(0, 7, (2, 3))
    shapes = []
    tile_shape = tiled.tile_shape
    monkeypatch.setattr(tiled, "tile_shape", lambda *args: shapes.append(args) or tile_shape(*args))
    for chunk_size, rows, budget in ((2, None, None), (None, 3, 10**9), (None, None, 4096)):
        reg = build_regularizer(_config(name="kl", form="full", coef=1.0, chunk_size=chunk_size))
        full = reg.full_from_hidden(hidden, head, ref_hidden, ref_head, targets, temperature=0.5,
                                    compute_dtype=torch.float32, rows=rows, workspace_bytes=budget)
        logits, ref_logits = head(hidden) / 0.5, ref_head(ref_hidden) / 0.5
        torch.testing.assert_close(full.divergence, reg.per_token(None, None, logits, ref_logits))
        torch.testing.assert_close(full.logps, torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0])
    assert [args[3] for args in shapes] == [2, 3, None]
    assert shapes[1][2] == tiled.MIN_WORKSPACE_BYTES and shapes[2][2] == 4096  # the library's cap; the caller's


def test_none_regularizer_adds_nothing_and_needs_no_reference():
    reg = build_regularizer(DivergenceConfig(name="none", coef=0.0))
    assert not reg.active and reg.per_token(torch.log(P), torch.log(Q)) is None
    inputs = PolicyInputs(logps=torch.log(P), old_logps=torch.log(P), advantages=torch.tensor([1.0, -2.0]),
                          mask=MASK)
    parts = compose_loss(inputs, PolicyParams(), "clip", None, 0.0, "dr_grpo", 3)
    assert parts.regularizer_value == 0.0 and parts.regularizer_term is None
    assert parts.loss.item() == pytest.approx((-3 * 1.0 + 2 * 2.0) / (2 * 3))


def test_member_params_build_the_neural_map_and_wrong_length_is_rejected():
    reg = build_regularizer(_config(name="neural_mirror"), _neural_vector(1.0, 0))
    torch.testing.assert_close(reg.per_token(torch.log(P), torch.log(Q)), 0.5 * (P - Q) ** 2)
    with pytest.raises(ValueError, match="380"):
        build_regularizer(DivergenceConfig(name="neural_mirror"), [0.1] * 10)


def test_policy_weight_scales_the_policy_term_only():
    """TRL's vLLM importance-sampling ratio multiplies the policy term; the regularizer is left as TRL leaves its KL."""
    logps, ref = torch.log(P), torch.log(Q)
    inputs = PolicyInputs(logps=logps, old_logps=logps, advantages=torch.tensor([1.0, -2.0]), mask=MASK)
    d = 0.5 * (P - Q) ** 2
    weight = torch.tensor([[0.5], [2.0]])
    parts = compose_loss(inputs, PolicyParams(), "clip", d, 0.3, "bnpo", 4, policy_weight=weight)
    policy = -torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]) * weight
    assert parts.loss.item() == pytest.approx(aggregate(policy + 0.3 * d, MASK, "bnpo", 4).item(), rel=1e-6)
    assert parts.regularizer_term.item() == pytest.approx(0.3 * aggregate(d, MASK, "bnpo", 4).item(), rel=1e-6)


def _categorical_gradients(estimator: str) -> dict[str, torch.Tensor]:
    """On a 5-way categorical pi = softmax(theta): the expected gradient of the per-token estimator under y ~ pi
    (sampling not differentiated, as in training), and the exact gradients of KL(pi || ref) and KL(ref || pi)."""
    theta = torch.tensor([0.3, -1.2, 0.8, 0.0, -0.4], dtype=torch.float64, requires_grad=True)
    ref = torch.softmax(torch.tensor([-0.5, 0.4, 1.1, -0.9, 0.2], dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    pi = logp.exp()
    per_token = kl_estimator(logp, ref.log(), estimator)  # the loss on each possible sampled token
    expected = torch.autograd.grad((pi.detach() * per_token).sum(), theta, retain_graph=True)[0]
    forward = torch.autograd.grad((pi * (logp - ref.log())).sum(), theta, retain_graph=True)[0]
    reverse = torch.autograd.grad((ref * (ref.log() - logp)).sum(), theta)[0]
    return {"expected": expected, "forward": forward, "reverse": reverse}


def test_kl_estimator_gradient_directions():
    """k2 follows KL(pi || ref), k3 follows KL(ref || pi), k1 has zero expected gradient (conf/divergence/kl.yaml)."""
    k1, k2, k3 = (_categorical_gradients(k) for k in ("k1", "k2", "k3"))
    assert k2["forward"].abs().max() > 0.05 and (k2["forward"] - k2["reverse"]).abs().max() > 0.05
    torch.testing.assert_close(k2["expected"], k2["forward"])
    torch.testing.assert_close(k3["expected"], k3["reverse"])
    torch.testing.assert_close(k1["expected"], torch.zeros(5, dtype=torch.float64))


def test_k1_refused_in_the_sampled_form_only():
    with pytest.raises(ValueError, match=r"divergence.estimator=k1.*zero expected gradient.*k3"):
        DivergenceConfig(name="kl", form="sampled", estimator="k1").validate()
    DivergenceConfig(name="kl", form="full", estimator="k1").validate()  # the estimator is unused there
    DivergenceConfig(name="kl", form="sampled", estimator="k3").validate()


def test_grad_share_floor_is_validated():
    with pytest.raises(ValueError, match="divergence.grad_share_floor"):
        DivergenceConfig(grad_share_floor=-0.1).validate()
    DivergenceConfig(grad_share_floor=None).validate()
