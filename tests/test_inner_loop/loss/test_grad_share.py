"""The regularizer gradient-share diagnostic: formulas against autograd, the trainer's logging, the floor warning."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.loss.grad_share import exact_share, logit_space_share, logp_space_share
from inner_loop.loss.compose import aggregate
from inner_loop.training.diagnostics import diagnostics_from_history
from inner_loop.models.loading import load_policy
from inner_loop.loss.regularizers import build_regularizer, warn_if_inert
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from mirror_maps import ProbL2, full_divergence
from mirror_maps.tiled import tiled_full_form
from helpers import SMALL_SHAPE


def test_exact_share_is_the_ratio_of_parameter_gradient_norms():
    w = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    b = torch.tensor([0.3], requires_grad=True)
    policy = (w * torch.tensor([1.0, 2.0, 3.0])).sum() + 2.0 * b.sum()  # grads (1, 2, 3) and 2
    reg = 0.5 * (w**2).sum()  # grad w = (1, -2, 0.5); b unused
    expected = math.sqrt(1 + 4 + 0.25) / math.sqrt(1 + 4 + 9 + 4)
    assert exact_share(policy, reg, [w, b]) == pytest.approx(expected)
    (policy + reg).backward()  # the graph is kept for the trainer's own backward
    assert w.grad is not None
    assert math.isnan(exact_share(0.0 * w.sum(), (w**2).sum(), [w]))  # no policy gradient: no share


def test_logp_space_share():
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    policy = (torch.tensor([[1.0, 2.0], [0.0, 2.0]]) * logps).sum()
    reg = 0.1 * (logps**2).sum()
    expected = math.sqrt(sum((0.2 * v) ** 2 for v in (-1.0, -2.0, -0.5, -3.0))) / 3.0
    assert logp_space_share(policy, reg, logps) == pytest.approx(expected)


def test_logit_space_share_equals_the_share_wrt_the_logits():
    """With the per-token norms of the full form's tiles (tests/test_mirror_maps/test_full_form_tiled.py checks them one by
    one)."""
    torch.manual_seed(1)
    potential = ProbL2()
    hidden, weight = torch.randn(2, 4, 5, dtype=torch.float64), torch.randn(9, 5, dtype=torch.float64)
    ref_hidden = torch.randn(2, 4, 5, dtype=torch.float64)
    logits = (hidden @ weight.t()).requires_grad_(True)
    ref_logits = ref_hidden @ weight.t()
    targets = torch.randint(0, 9, (2, 4))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    logps = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    d = full_divergence(potential, logits, ref_logits)
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    policy = aggregate(-adv * torch.exp(logps - logps.detach()), mask, "dr_grpo", 6)
    reg = 0.7 * aggregate(d, mask, "dr_grpo", 6)
    g_pol = torch.autograd.grad(policy, logits, retain_graph=True)[0]
    g_reg = torch.autograd.grad(reg, logits, retain_graph=True)[0]
    tiles = tiled_full_form(potential, hidden, weight, ref_hidden, weight, targets, with_norms=True)
    share = logit_space_share(policy, reg, logps, d, tiles.policy_norms, tiles.divergence_norms)
    assert share == pytest.approx(float(g_reg.norm() / g_pol.norm()), rel=1e-6)


def _trainer(tiny_dir, tmp_path, divergence: DivergenceConfig, lora_r: int = 0):
    from datasets import Dataset
    from trl import GRPOConfig

    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(lora_r=lora_r, lora_alpha=8, **SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=3, beta=0.0, loss_type="dr_grpo", report_to=[], use_cpu=True,
                      max_steps=1, bf16=False)
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 4}),
                                processing_class=tok, regularizer=build_regularizer(divergence))
    trainer.model.train()
    return trainer


def _batch(trainer):
    tok = trainer.processing_class
    prompt = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]] * 2)
    completion = torch.tensor([tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                               tok("1", add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]])
    return {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
            "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "advantages": torch.tensor([0.5, -0.5])}


def _independent_exact(trainer, batch) -> float:
    """The parameter-space share from two separate backward passes of the two terms (coef 1 -> x coef)."""
    reg = trainer.regularizer
    coef = reg.coef
    grads = []
    for part in ("policy", "regularizer"):
        trainer.model.zero_grad(set_to_none=True)
        reg.coef = 1e-30 if part == "policy" else coef  # the policy term alone (regularizer gradient ~0)
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    reg.coef = coef
    policy_grad, total_grad = grads
    return float((total_grad - policy_grad).norm() / policy_grad.norm())


@pytest.mark.parametrize("form,lora_r", [("sampled", 0), ("full", 0), ("sampled", 4)])
def test_trainer_logs_the_share_per_batch_and_exactly_once_from_step_1(tiny_dir, tmp_path, form, lora_r):
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="neural_mirror", form=form, coef=30.0), lora_r)
    batch = _batch(trainer)
    metrics = trainer._metrics["train"]
    trainer._compute_loss(trainer.model, batch)  # step 0: policy == reference, the regularizer has no gradient
    assert metrics["regularizer/grad_share"][0] < 1e-6 and "regularizer/grad_share_exact" not in metrics
    with torch.no_grad():
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))
    trainer.state.global_step = 1
    trainer._compute_loss(trainer.model, batch).backward()  # the exact measurement keeps the graph
    exact = metrics["regularizer/grad_share_exact"]
    assert len(exact) == 1 and exact[0] > 0 and metrics["regularizer/grad_share_exact_step"] == [1.0]
    assert exact[0] == pytest.approx(_independent_exact(trainer, batch), rel=2e-3)
    assert metrics["regularizer/grad_share"][-1] > 0
    trainer._compute_loss(trainer.model, batch)
    assert len(metrics["regularizer/grad_share_exact"]) == 1  # once per run


def test_the_exact_share_waits_for_the_policy_to_leave_the_reference(tiny_dir, tmp_path):
    """A first step whose groups all tie has no policy gradient, so the policy is still the reference at step 1
    (the SmolLM2 rehearsal showed it); a share of exactly 0 there says nothing about the coefficient."""
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="neural_mirror", coef=30.0))
    batch, metrics = _batch(trainer), trainer._metrics["train"]
    trainer.state.global_step = 1
    trainer._compute_loss(trainer.model, batch).backward()  # unchanged weights: no measurement yet
    assert "regularizer/grad_share_exact" not in metrics
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    trainer.state.global_step = 2
    trainer._compute_loss(trainer.model, batch).backward()
    assert metrics["regularizer/grad_share_exact"][0] > 0 and metrics["regularizer/grad_share_exact_step"] == [2.0]


def test_no_share_without_a_regularizer_or_outside_training(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="none", coef=0.0))
    trainer._compute_loss(trainer.model, _batch(trainer))
    assert "regularizer/grad_share" not in trainer._metrics["train"]
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="prob_l2", coef=1.0))
    with torch.no_grad():
        trainer._compute_loss(trainer.model, _batch(trainer))
    assert "regularizer/grad_share" not in trainer._metrics["train"]


def test_share_reaches_the_result_diagnostics():
    history = [{"regularizer/grad_share": 0.0, "step": 1},
               {"regularizer/grad_share": 0.2, "regularizer/grad_share_exact": 0.25,
                "regularizer/grad_share_exact_step": 1.0, "step": 2},
               {"regularizer/grad_share": 0.4, "regularizer/grad_share_exact": None, "step": 3}]
    diagnostics = diagnostics_from_history(history)
    assert diagnostics["regularizer_grad_share"] == pytest.approx(0.2)
    assert diagnostics["regularizer_grad_share_exact"] == 0.25
    assert diagnostics["regularizer_grad_share_exact_step"] == 1.0
    assert "regularizer_share" not in diagnostics


def test_warning_below_the_floor_names_the_member_and_the_value(caplog):
    with caplog.at_level(logging.WARNING, logger="inner_loop.loss.regularizers"):
        assert warn_if_inert({"regularizer_grad_share": 2.5e-6}, 0.01, "/runs/gen_0001/member_007")
    assert "/runs/gen_0001/member_007" in caplog.text and "2.5e-06" in caplog.text
    assert "divergence.grad_share_floor=0.01" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inner_loop.loss.regularizers"):
        assert not warn_if_inert({"regularizer_grad_share": 0.2}, 0.01, "m")
        assert not warn_if_inert({"regularizer_grad_share": 2.5e-6}, None, "m")  # null disables
        assert not warn_if_inert({}, 0.01, "m")  # no regularizer: nothing to judge
    assert caplog.text == ""
