"""MirrorGRPOTrainer._compute_loss: the right model is the reference, forms are wired, NaN stops the run."""
from __future__ import annotations

import pytest
import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.loss.compose import aggregate
from inner_loop.models.loading import load_policy
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.grpo.trainer import MirrorGRPOTrainer, NonFiniteLossError
from helpers import SMALL_SHAPE


def _trainer(tiny_dir, tmp_path, divergence: DivergenceConfig, lora_r: int = 0, aggregation: str = "bnpo",
             full_form_rows: int | None = None):
    from datasets import Dataset
    from trl import GRPOConfig

    model, tok = load_policy(ModelConfig(lora_r=lora_r, lora_alpha=8, **SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=3, beta=0.0, loss_type=aggregation, report_to=[], use_cpu=True,
                      temperature=1.0, max_steps=1, bf16=False)
    data = Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]})
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=args, train_dataset=data, processing_class=tok,
                                regularizer=build_regularizer(divergence), full_form_rows=full_form_rows)
    trainer.model.train()
    return trainer


def _batch(tok):
    prompt = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]] * 2)
    completion = torch.tensor([tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                               tok("1", add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]])
    return {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
            "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "advantages": torch.tensor([0.5, -0.5])}


def _logits(model, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return logits[:, batch["prompt_ids"].size(1) - 1 : -1]


def _perturb(model):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))


@pytest.mark.parametrize("form", ["sampled", "full"])
def test_loss_uses_the_frozen_initial_model_as_reference(tiny_dir, tmp_path, form):
    torch.manual_seed(0)
    initial, tok = load_policy(ModelConfig(**SMALL_SHAPE), tiny_dir)
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="prob_l2", form=form, coef=2.0))
    batch = _batch(tok)
    assert trainer._compute_loss(trainer.model, batch).item() == pytest.approx(
        -((0.5 * 3) - (0.5 * 2)) / 5, abs=1e-6)  # reference == policy: only the policy term (ratio 1, bnpo)
    _perturb(trainer.model)
    loss = trainer._compute_loss(trainer.model, batch)
    p_logits, q_logits = _logits(trainer.model, batch), _logits(initial, batch)
    p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
    mask = batch["completion_mask"].float()
    if form == "full":
        d = 0.5 * ((p - q) ** 2).sum(-1)
    else:
        idx = batch["completion_ids"].unsqueeze(-1)
        d = 0.5 * (p.gather(-1, idx) - q.gather(-1, idx)).squeeze(-1) ** 2
    expected = aggregate(-batch["advantages"].unsqueeze(1).expand(2, 3) + 2.0 * d, mask, "bnpo", 3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert d.sum() > 0
    assert trainer._metrics["train"]["regularizer/value"][-1] == pytest.approx(aggregate(d, mask, "bnpo", 3).item(),
                                                                               rel=1e-4)


def test_full_form_in_recomputed_row_chunks_matches_one_chunk(tiny_dir, tmp_path):
    """Chunking the full form's forward over batch rows (recomputed in backward) changes neither loss nor grads."""
    results = []
    for rows in (None, 1):
        torch.manual_seed(0)
        trainer = _trainer(tiny_dir, tmp_path / str(rows), DivergenceConfig(name="neural_mirror", form="full",
                                                                            coef=50.0), full_form_rows=rows)
        _perturb(trainer.model)
        loss = trainer._compute_loss(trainer.model, _batch(trainer.processing_class))
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((loss.detach(), grads, trainer._metrics["train"]["regularizer/value"][-1]))
    (loss_one, grads_one, reg_one), (loss_rows, grads_rows, reg_rows) = results
    assert reg_one > 0 and reg_rows == pytest.approx(reg_one, rel=1e-5)
    assert torch.allclose(loss_rows, loss_one, rtol=1e-5, atol=1e-7)
    # float32 sums in another order: a gradient element near zero differs by ~1e-7 of the largest one (measured
    # 4.8e-7 of 2.09 at one thread), so the absolute tolerance scales with the gradient; a row left out of the
    # chunked regularizer moves the grads by orders more
    assert grads_one.abs().sum() > 0
    assert torch.allclose(grads_rows, grads_one, rtol=1e-4, atol=1e-5 * float(grads_one.abs().max()))


def test_lora_reference_is_the_base_with_the_adapter_disabled(tiny_dir, tmp_path):
    torch.manual_seed(0)
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="kl", form="full", coef=1.0), lora_r=4)
    batch = _batch(trainer.processing_class)
    _perturb(trainer.model)  # moves only the LoRA weights
    base, _ = load_policy(ModelConfig(**SMALL_SHAPE), tiny_dir)
    trainer._compute_loss(trainer.model, batch)
    p = torch.softmax(_logits(trainer.model, batch), -1)
    q = torch.softmax(_logits(base, batch), -1)
    kl = (p * (p / q).log()).sum(-1)
    expected = aggregate(kl, batch["completion_mask"].float(), "bnpo", 3).item()
    assert expected > 0
    assert trainer._metrics["train"]["regularizer/value"][-1] == pytest.approx(expected, rel=1e-4)


def test_non_finite_loss_raises(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, DivergenceConfig(name="none", coef=0.0))
    batch = _batch(trainer.processing_class)
    batch["advantages"] = torch.tensor([float("nan"), 0.0])
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        trainer._compute_loss(trainer.model, batch)


def test_trl_kl_must_be_off(tiny_dir, tmp_path):
    from trl import GRPOConfig

    model, tok = load_policy(ModelConfig(**SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path), beta=0.1, report_to=[], use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="beta=0"):
        MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0], args=args,
                          processing_class=tok, regularizer=build_regularizer(DivergenceConfig(name="kl")))
