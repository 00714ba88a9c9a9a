"""Continuous batching with bf16 (what a GPU preset runs) keeps the trained LoRA weights and Adam's state in float32.

TRL 1.16 casts the whole policy to bf16 before every continuous-batching generation, in place on the Parameter objects
the optimizer holds (trl/trainer/grpo_trainer.py, ``_generate_single_turn``). Reproduced here on the CPU: without
MirrorGRPOTrainer keeping its master weights, the LoRA weights are bf16 after the first generation."""
from __future__ import annotations

import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.models.loading import load_policy
from helpers import SMALL_SHAPE


def _trainer(tiny_dir: str, tmp_path, bf16: bool) -> MirrorGRPOTrainer:
    from datasets import Dataset
    from trl import GRPOConfig

    model, tok = load_policy(ModelConfig(lora_r=4, lora_alpha=8, **SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=3, beta=0.0, loss_type="dr_grpo", report_to=[], use_cpu=True,
                      max_steps=2, bf16=bf16, learning_rate=1e-5, save_strategy="no", logging_steps=1,
                      use_transformers_continuous_batching=True,
                      transformers_continuous_batching_config={"num_blocks": 16, "max_batch_tokens": 64})
    data = Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]})
    return MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
                             args=args, train_dataset=data, processing_class=tok,
                             regularizer=build_regularizer(DivergenceConfig(name="prob_l2", coef=1.0)))


def test_bf16_continuous_batching_trains_float32_lora_weights_and_adam_state(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, bf16=True)
    lora = {name: param for name, param in trainer.model.named_parameters() if param.requires_grad}
    assert lora and all(param.dtype == torch.float32 for param in lora.values())
    before = {name: param.detach().clone() for name, param in lora.items()}
    trainer.train()
    assert trainer.state.global_step == 2  # two generations, each with TRL's cast
    wrong = {name: param.dtype for name, param in lora.items() if param.dtype != torch.float32}
    assert not wrong, f"trained weights cast by TRL's generation: {wrong}"
    states = [t for state in trainer.optimizer.state.values() for t in state.values()
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0]
    assert states and all(t.dtype == torch.float32 for t in states)
    moved = [name for name, param in lora.items() if "lora_B" in name and not torch.equal(param, before[name])]
    assert moved  # the weights trained (lora_B starts at 0, so its first steps are what a bf16 cast would round)
