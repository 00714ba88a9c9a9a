"""Trust-region policy terms (docs/method.md §4): bounds, masks and gradient weights against hand-derived closed forms."""
from __future__ import annotations

import math

import pytest
import torch

from inner_loop.loss.policy_terms import PolicyInputs, PolicyParams
from inner_loop.loss.trust_regions import (
    TRUST_REGION_TERMS,
    binary_kl,
    kl3_ratio_bounds,
    lambert_w,
)
from conf_groups import load_group


def _inputs(pi: list[float], mu: list[float], adv: list[float]) -> PolicyInputs:
    """One token per sequence: pi, mu are the sampled token's probabilities under the policy and behaviour."""
    logps = torch.log(torch.tensor(pi, dtype=torch.float64)).unsqueeze(1).requires_grad_(True)
    old = torch.log(torch.tensor(mu, dtype=torch.float64)).unsqueeze(1)
    return PolicyInputs(logps=logps, old_logps=old, advantages=torch.tensor(adv, dtype=torch.float64),
                        mask=torch.ones_like(old))


def _grad_weight_on_ratio(name: str, inputs: PolicyInputs, **extra: float) -> torch.Tensor:
    """d(-loss)/dr per token: the weight the term puts on grad r (autograd through log pi, divided by r)."""
    out = TRUST_REGION_TERMS[name](inputs, PolicyParams(extra=extra))
    (grad_logp,) = torch.autograd.grad(out.per_token_loss.sum(), inputs.logps)
    ratio = torch.exp(inputs.logps - inputs.old_logps).detach()
    return (-grad_logp / ratio).squeeze(1)


def test_lambert_w_solves_its_defining_equation_on_both_branches():
    for z in (-1 / math.e + 1e-9, -0.3, -0.1, -1e-4):
        for branch in (0, -1):
            w = lambert_w(z, branch)
            assert w * math.exp(w) == pytest.approx(z, rel=1e-10, abs=1e-14)
            assert (w >= -1) if branch == 0 else (w <= -1)


def test_kl3_bounds_for_delta_001_match_the_paper_and_are_asymmetric():
    low, high = kl3_ratio_bounds(0.01)
    assert low == pytest.approx(0.865, abs=1e-3) and high == pytest.approx(1.148, abs=1e-3)
    assert high - 1 > 1 - low
    for r in (low, high):
        assert r - 1 - math.log(r) == pytest.approx(0.01, rel=1e-9)


def test_kl3_clip_zeroes_the_gradient_exactly_outside_its_bounds():
    low, high = kl3_ratio_bounds(0.01)
    mu = 0.5
    pis = [mu * 1.05, mu * (high + 0.02), mu * (low - 0.02), mu * (high + 0.02), mu * (low - 0.02)]
    adv = [1.0, 1.0, -1.0, -1.0, 1.0]
    weight = _grad_weight_on_ratio("kl3_clip", _inputs(pis, [mu] * 5, adv))
    # inside: plain A; above the upper bound with A > 0 or below the lower with A < 0: clipped (0);
    # outside on the side that the advantage pulls back from: still the plain gradient (PPO's min).
    assert weight.tolist() == pytest.approx([1.0, 0.0, 0.0, -1.0, 1.0])


@pytest.mark.parametrize("name,delta,far_up,far_down", [
    ("dppo_tv", 0.15, (0.4, 0.6), (0.6, 0.4)),
    ("dppo_kl", 0.05, (0.4, 0.7), (0.7, 0.4)),
])
def test_dppo_masks_on_the_four_sign_cases(name, delta, far_up, far_down):
    mu_up, pi_up = far_up  # pi moved far above mu
    mu_down, pi_down = far_down  # pi moved far below mu
    pis = [pi_up, pi_up, pi_down, pi_down, 0.5]
    mus = [mu_up, mu_up, mu_down, mu_down, 0.5]
    adv = [1.0, -1.0, -1.0, 1.0, 1.0]
    inputs = _inputs(pis, mus, adv)
    out = TRUST_REGION_TERMS[name](inputs, PolicyParams(extra={"delta": delta}))
    weight = _grad_weight_on_ratio(name, _inputs(pis, mus, adv), delta=delta)
    # A > 0 and pi already far above mu: masked. A < 0 with pi above mu pulls back: kept.
    # A < 0 and pi already far below mu: masked. A > 0 with pi below mu pulls back: kept. Inside: kept.
    assert weight.tolist() == pytest.approx([0.0, -1.0, 0.0, 1.0, 1.0])
    assert out.metrics["trust_region/masked_frac"] == pytest.approx(2 / 5)


def test_dppo_kl_mask_uses_the_binary_kl_of_the_sampled_token():
    mu, pi = torch.tensor([0.4]), torch.tensor([0.7])
    expected = 0.4 * math.log(0.4 / 0.7) + 0.6 * math.log(0.6 / 0.3)
    assert float(binary_kl(mu, pi)) == pytest.approx(expected, rel=1e-6)


def test_spo_gradient_weight_is_a_minus_abs_a_times_r_minus_1_over_eps():
    pis, mus, adv = [0.3, 0.6, 0.5, 0.2], [0.5, 0.5, 0.4, 0.25], [1.0, 1.0, -2.0, -0.5]
    eps = 0.2
    weight = _grad_weight_on_ratio("spo", _inputs(pis, mus, adv), epsilon=eps)
    r = torch.tensor(pis, dtype=torch.float64) / torch.tensor(mus, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)
    assert torch.allclose(weight, a - a.abs() * (r - 1) / eps)


def test_drpo_gradient_weight_matches_the_closed_form():
    pis, mus, adv = [0.3, 0.6, 0.5, 0.2, 0.45], [0.5, 0.5, 0.4, 0.25, 0.45], [1.0, 1.0, -2.0, -0.5, 3.0]
    delta = 0.5
    weight = _grad_weight_on_ratio("drpo", _inputs(pis, mus, adv), delta=delta)
    pi, mu = torch.tensor(pis, dtype=torch.float64), torch.tensor(mus, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)
    closed = a * (1 - torch.sign(a * (pi / mu - 1)) * (pi - mu).abs() / delta)
    assert torch.allclose(weight, closed)


@pytest.mark.parametrize("name", sorted(TRUST_REGION_TERMS))
@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan")])
def test_non_positive_sizes_are_refused_with_the_key_named(name, bad):
    key = "epsilon" if name == "spo" else "delta"
    with pytest.raises(ValueError, match=rf"train\.policy_extra\.{key}"):
        TRUST_REGION_TERMS[name](_inputs([0.5], [0.5], [1.0]), PolicyParams(extra={key: bad}))


@pytest.mark.parametrize("name", sorted(TRUST_REGION_TERMS))
def test_every_term_equals_minus_advantage_on_policy(name):
    """At r = 1 (first pass over fresh rollouts) every host reduces to the plain policy gradient -A."""
    adv = [1.0, -0.5, 2.0]
    inputs = _inputs([0.3, 0.5, 0.9], [0.3, 0.5, 0.9], adv)
    out = TRUST_REGION_TERMS[name](inputs, PolicyParams())
    assert out.per_token_loss.squeeze(1).tolist() == pytest.approx([-a for a in adv])
    assert _grad_weight_on_ratio(name, _inputs([0.3, 0.5, 0.9], [0.3, 0.5, 0.9], adv)).tolist() == pytest.approx(adv)


def _inner_with(policy_loss: str, extra: dict) -> dict:
    from pathlib import Path


    conf = Path(__file__).resolve().parents[3] / "conf"
    load = lambda group, name: load_group(group, name, conf)  # noqa: E731
    inner = {"task": load("task", "arith"), "model": load("model", "tiny"),
             "divergence": load("divergence", "prob_l2"), "train": load("train", "default")}
    inner["train"].update(policy_loss=policy_loss, policy_extra=extra)
    return inner


@pytest.mark.parametrize("name,extra,message", [
    ("dppo_tv", {"delta": -0.1}, r"train\.policy_extra\.delta"),
    ("kl3_clip", {"delta": 0.0}, r"train\.policy_extra\.delta"),
    ("spo", {"delta": 0.1}, r"policy_extra has keys \['delta'\]"),
    ("clip", {"delta": 0.1}, r"policy_extra has keys \['delta'\]"),
])
def test_inner_config_refuses_bad_trust_region_parameters_before_training(name, extra, message):
    from inner_loop.config import InnerConfig

    with pytest.raises(ValueError, match=message):
        InnerConfig.from_dict(_inner_with(name, extra))


def test_inner_config_accepts_every_registered_trust_region_host():
    from inner_loop.config import InnerConfig

    for name in TRUST_REGION_TERMS:
        cfg = InnerConfig.from_dict(_inner_with(name, {}))
        assert cfg.train.policy_loss == name
