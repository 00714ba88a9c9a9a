"""A GBMPO training step on CUDA: the neural mirror map (built on the CPU) must follow the policy to the GPU.

Found on an H200: every NM-GRPO member failed its first step with "Expected all tensors to be on the same
device" in mirror_maps/fused.py, because the map's parameters stayed on the CPU while the log-probs were on
CUDA. Skipped (with its reason under -ra) where torch sees no CUDA device; the CPU path is tested everywhere else.
"""
from __future__ import annotations

import math

import pytest
import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.models.loading import load_policy
from inner_loop.models.tiny import tiny_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


@pytest.mark.parametrize("lora_r", [0, 8])
@pytest.mark.parametrize("form", ["sampled", "full"])
def test_neural_mirror_member_trains_a_step_on_cuda(tmp_path, form, lora_r):
    from datasets import Dataset
    from trl import GRPOConfig

    model_dir = str(tiny_model_dir(ModelConfig(**SMALL), root=tmp_path / "cache"))
    model, tok = load_policy(ModelConfig(lora_r=lora_r, lora_alpha=8, **SMALL), model_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, beta=0.0, loss_type="dr_grpo", report_to=[], temperature=1.0,
                      max_steps=1, bf16=False, logging_steps=1)
    prompts = ["1+1=", "2+2=", "3+3=", "4+4="]

    def reward(completions, **_):  # rewards that differ, so the groups have advantages and the loss a gradient
        return [float(len(c) % 2) for c in completions]

    regularizer = build_regularizer(DivergenceConfig(name="neural_mirror", form=form, coef=1.0))
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=reward, args=args,
                                train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                                regularizer=regularizer)
    assert trainer.accelerator.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in regularizer.potential.parameters())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses)


def test_trls_triton_kernels_build_and_run_on_this_gpu():
    """What a member's device check launches before its model loads (inner_loop/member/device.py): on a node without the
    toolchain Triton needs (a C compiler, Python.h, libcuda) this names the cause and the node is excluded."""
    from inner_loop.member.device import kernel_problem

    assert kernel_problem(torch.device("cuda", torch.cuda.current_device())) == ""
