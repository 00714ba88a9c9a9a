"""Our `_compute_loss` against TRL's own on the same trainer and inputs (regularizer off): loss and gradients.

What TRL's loss honours (vLLM importance-sampling ratio, tool mask, `old_per_token_logps` None, asymmetric clipping,
each aggregation, gradient accumulation) ours must honour too; a TRL bump that changes that contract, or makes its
loss read a new option, fails here.
"""
from __future__ import annotations

import inspect
import re

import pytest
import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.models.loading import load_policy
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from inner_loop.trl_settings.trl_contract import REVIEWED_LOSS_INPUTS, unsupported_grpo_fields
from helpers import SMALL_SHAPE

ROWS, PROMPT_LEN, COMPLETION_LEN = 4, 5, 6


def _args(tmp_path, aggregation: str = "dr_grpo", **extra):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=COMPLETION_LEN + 2, beta=0.0, loss_type=aggregation, report_to=[],
                      use_cpu=True, max_steps=1, bf16=False, epsilon=0.2, epsilon_high=0.28, **extra)


def _trainer(tiny_dir, tmp_path, aggregation: str, divergence: DivergenceConfig | None = None, **extra):
    from datasets import Dataset

    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(**SMALL_SHAPE), tiny_dir)
    with torch.no_grad():  # away from the init, so ratios and gradients are not special
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    trainer = MirrorGRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=_args(tmp_path, aggregation, **extra), train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 4}),
        processing_class=tok, regularizer=build_regularizer(divergence or DivergenceConfig(name="none", coef=0.0)))
    trainer.model.train()
    return trainer


def _inputs(case: str, vocab: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    completion_mask = torch.ones(ROWS, COMPLETION_LEN, dtype=torch.long)
    for row, length in enumerate((6, 4, 5, 2)):
        completion_mask[row, length:] = 0
    batch = {
        "prompt_ids": torch.randint(3, vocab, (ROWS, PROMPT_LEN), generator=gen),
        "prompt_mask": torch.ones(ROWS, PROMPT_LEN, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (ROWS, COMPLETION_LEN), generator=gen),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([0.7, -0.7, 1.3, -1.3]),
    }
    if case != "on_policy":  # behaviour log-probs off the current ones, so the clipping bites on both sides
        batch["old_per_token_logps"] = torch.log(torch.rand(ROWS, COMPLETION_LEN, generator=gen) * 0.2 + 0.01)
    if case == "tool_mask":
        tool = torch.ones(ROWS, COMPLETION_LEN, dtype=torch.long)
        tool[0, 1:3] = 0
        tool[2, 0] = 0
        batch["tool_mask"] = tool
    if case == "is_ratio_token":
        batch["importance_sampling_ratio"] = torch.rand(ROWS, COMPLETION_LEN, generator=gen) * 2.0
    if case == "is_ratio_sequence":
        batch["importance_sampling_ratio"] = torch.tensor([[1.0], [0.0], [1.0], [1.0]])  # sequence_mask mode
    return batch


def _loss_and_grads(loss_fn, trainer, inputs) -> tuple[float, torch.Tensor]:
    trainer.model.zero_grad(set_to_none=True)
    loss = loss_fn(trainer, trainer.model, inputs)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return loss.item(), grads


@pytest.mark.parametrize("case", ["on_policy", "off_policy", "tool_mask", "is_ratio_token", "is_ratio_sequence"])
@pytest.mark.parametrize("aggregation", ["dr_grpo", "grpo", "bnpo"])
def test_loss_and_gradients_match_trl(tiny_dir, tmp_path, aggregation, case):
    from trl import GRPOTrainer

    trainer = _trainer(tiny_dir, tmp_path, aggregation)
    if case.startswith("is_ratio"):
        # What GRPOTrainer sets from use_vllm=True (which needs the vllm package) and the correction's default.
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.current_gradient_accumulation_steps = 2  # both divide by it in training
    inputs = _inputs(case, trainer.model.config.vocab_size)
    ours, our_grads = _loss_and_grads(MirrorGRPOTrainer._compute_loss, trainer, inputs)
    theirs, their_grads = _loss_and_grads(GRPOTrainer._compute_loss, trainer, inputs)
    assert their_grads.abs().max() > 1e-4  # a real gradient, not two zeros
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(our_grads, their_grads, rtol=1e-4, atol=1e-7)


def test_the_importance_ratio_is_ignored_without_vllm_as_in_trl(tiny_dir, tmp_path):
    """TRL applies the ratio only when vLLM generated and the correction is on; so do we."""
    from trl import GRPOTrainer

    trainer = _trainer(tiny_dir, tmp_path, "dr_grpo")
    trainer.current_gradient_accumulation_steps = 1
    inputs = _inputs("is_ratio_token", trainer.model.config.vocab_size)
    plain = {k: v for k, v in inputs.items() if k != "importance_sampling_ratio"}
    ours = MirrorGRPOTrainer._compute_loss(trainer, trainer.model, inputs).item()
    assert ours == pytest.approx(GRPOTrainer._compute_loss(trainer, trainer.model, inputs).item(), rel=1e-6)
    assert ours == pytest.approx(MirrorGRPOTrainer._compute_loss(trainer, trainer.model, plain).item(), rel=1e-6)


def test_importance_ratio_weights_the_policy_term_not_the_regularizer(tiny_dir, tmp_path):
    """With a regularizer, the ratio scales only the policy part: a zero ratio leaves exactly coef * D."""
    trainer = _trainer(tiny_dir, tmp_path, "bnpo", DivergenceConfig(name="prob_l2", form="sampled", coef=3.0))
    with torch.no_grad():  # move the policy off the (frozen) reference so D > 0
        for param in trainer.model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    inputs = _inputs("is_ratio_token", trainer.model.config.vocab_size)
    inputs["importance_sampling_ratio"] = torch.zeros(ROWS, COMPLETION_LEN)
    loss = MirrorGRPOTrainer._compute_loss(trainer, trainer.model, inputs).item()
    value = trainer._metrics["train"]["regularizer/value"][-1]
    assert value > 0 and loss == pytest.approx(3.0 * value, rel=1e-5)


REFUSED = [("delta", 1.5), ("importance_sampling_level", "sequence"), ("top_entropy_quantile", 0.2),
           ("entropy_coef", 0.01), ("use_adaptive_entropy", True), ("off_policy_mask_threshold", 0.5)]


@pytest.mark.parametrize("field,value", REFUSED)
def test_options_our_loss_does_not_honour_are_refused(tiny_dir, tmp_path, field, value):
    assert any(f"train.trl.{field}=" in m for m in unsupported_grpo_fields({field: value}))
    with pytest.raises(ValueError, match=f"train.trl.{field}="):
        _trainer(tiny_dir, tmp_path, "dr_grpo", **{field: value})


def test_defaults_and_honoured_options_are_not_refused():
    from trl import GRPOConfig

    assert unsupported_grpo_fields({}) == []
    assert unsupported_grpo_fields({"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate",
                                    "router_aux_loss_coef": 0.0, "mask_truncated_completions": True}) == []
    assert unsupported_grpo_fields(GRPOConfig(output_dir="unused", report_to=[], use_cpu=True, bf16=False)) == []
    assert unsupported_grpo_fields({"router_aux_loss_coef": 0.01})


def test_every_input_of_trls_loss_has_been_reviewed():
    """A TRL bump whose loss reads a new option, input or helper fails here until trl_loss_contract.py says how our
    loss treats it (honour it, or refuse it up front)."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    read = set(re.findall(r"self\.args\.(\w+)", source))
    read |= set(re.findall(r"self\.(?!args\b)(\w+)", source))
    read |= set(re.findall(r"inputs(?:\.get\(|\[)\"(\w+)\"", source))
    assert "importance_sampling_ratio" in read and "tool_mask" in read  # the regexes do see the source
    assert sorted(read - set(REVIEWED_LOSS_INPUTS)) == []
