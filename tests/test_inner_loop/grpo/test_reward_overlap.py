"""The sandbox's rewards scored while the reference's forward runs (issue 60 item 5), and the rest of the step named
for a profile.

Why: the overlap must change when things run, never what is computed: the same rewards, the same reference
log-probs, the same trained weights and the same random streams as scoring first and running the reference in the
loss. A tiny LoRA member trains two steps each way (two micro-batches per generation, LoRA dropout drawing from
torch's generator) and must agree bit for bit; the rewards must really be scored while the reference's forward runs;
one profiled step must name every range of the step.
"""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from inner_loop.config import DivergenceConfig, ModelConfig
from inner_loop.grpo.step_profile import StepProfileCallback
from inner_loop.grpo.trainer import REFERENCE_LOGPS, MirrorGRPOTrainer
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.models.loading import load_policy
from helpers import SMALL_SHAPE

LORA = ModelConfig(lora_r=4, lora_alpha=8, lora_dropout=0.2, **SMALL_SHAPE)


def _trainer(tiny_dir: str, tmp_path: Any, overlap: bool, reward: Any, callbacks: list | None = None) -> Any:
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOConfig

    set_seed(0)
    model, tok = load_policy(LORA, tiny_dir, 0)
    args = GRPOConfig(output_dir=str(tmp_path / f"out-{overlap}"), per_device_train_batch_size=4, num_generations=2,
                      gradient_accumulation_steps=2, max_completion_length=6, beta=0.0, loss_type="dr_grpo",
                      report_to=[], use_cpu=True, max_steps=2, bf16=False, save_strategy="no", logging_steps=1,
                      disable_tqdm=True, learning_rate=1e-2, seed=0)
    data = Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="] * 2})
    return MirrorGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                             regularizer=build_regularizer(DivergenceConfig(name="prob_l2", form="sampled", coef=5.0)),
                             score_beside_reference=overlap, callbacks=callbacks or [])


def test_rewards_scored_beside_the_reference_train_bit_for_bit_as_in_sequence(tiny_dir, tmp_path):
    seen: dict[bool, list[tuple[bool, bool]]] = {True: [], False: []}
    reference_started = threading.Event()

    def reward_for(overlap: bool) -> Any:
        def reward(completions: list[str], **_: Any) -> list[float]:
            # with the overlap, the reference's forward starts while this waits (it would not, scored in sequence)
            concurrent = reference_started.wait(timeout=60) if overlap else False
            reference_started.clear()
            seen[overlap].append((threading.current_thread() is threading.main_thread(), concurrent))
            return [float(len(c) % 3) / 2 + 0.1 * c.count("1") for c in completions]
        return reward

    runs = {}
    for overlap in (False, True):
        profile = StepProfileCallback(2)
        trainer = _trainer(tiny_dir, tmp_path, overlap, reward_for(overlap), [profile])
        reference = trainer._reference_logps

        def started(batch: Any, _reference: Any = reference) -> Any:
            reference_started.set()
            return _reference(batch)

        trainer._reference_logps = started
        trainer.train()
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        logs = [{k: v for k, v in h.items() if k.startswith(("reward", "loss", "regularizer/value"))}
                for h in trainer.state.log_history]
        runs[overlap] = (weights, logs, torch.get_rng_state(), trainer.references_beside_rewards, profile.summary)
    (w_seq, logs_seq, rng_seq, early_seq, _), (w_ovl, logs_ovl, rng_ovl, early_ovl, profile) = runs[False], runs[True]
    assert seen[False] == [(True, False)] * 2  # scored on the trainer's thread, the reference in the loss
    assert seen[True] == [(False, True)] * 2 and (early_seq, early_ovl) == (0, 2)
    assert logs_ovl == logs_seq and any("reward" in h for h in logs_seq)
    assert {n: torch.equal(w, w_ovl[n]) for n, w in w_seq.items()} == {n: True for n in w_seq}
    assert any(not torch.equal(w, torch.zeros_like(w)) for n, w in w_seq.items() if "lora_B" in n)  # it trained
    assert torch.equal(rng_ovl, rng_seq)  # the same draws from torch's generator, in the same order
    ranges = profile["ranges"]  # one profiled step: every range of it named, the rewards on their own thread
    assert {name: ranges[name]["calls"] for name in ("step", "prepare_inputs", "generate", "rewards", "rewards_wait",
                                                     "reference_forward", "backward", "optimizer", "grad_clip")} == {
        "step": 1, "prepare_inputs": 2, "generate": 1, "rewards": 1, "rewards_wait": 1, "reference_forward": 1,
        "backward": 2, "optimizer": 1, "grad_clip": 1}
    assert ranges["policy_forward"]["calls"] == ranges["compute_loss"]["calls"] == 2
    assert 0 < ranges["prepare_inputs"]["own_host_s"] < ranges["prepare_inputs"]["host_s"]
    assert profile["device"] == "cpu" and ranges["backward"]["device_s"] is None and profile["decode_window"] is None


def test_the_reference_is_the_base_model_without_peft_walking_the_model(tiny_dir, tmp_path, monkeypatch):
    """PEFT's own ``disable_adapter`` reads the adapter status of every module and parameter and walks every module
    twice, at every use (41-52 ms at Qwen3-1.7B's size on this host): the trainer's reference must give the same
    log-probs without it, and leave the adapter on and trainable."""
    from peft import PeftModel

    trainer = _trainer(tiny_dir, tmp_path, True, lambda completions, **_: [0.0] * len(completions))
    model = trainer.model
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    ids = torch.tensor([trainer.processing_class("12+3=15", add_special_tokens=False)["input_ids"]])
    model.eval()
    with torch.no_grad():
        with model.disable_adapter():
            expected = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        monkeypatch.setattr(PeftModel, "get_model_status", lambda self: pytest.fail("PEFT's status walk"))
        monkeypatch.setattr(PeftModel, "disable_adapter", lambda self: pytest.fail("PEFT's disable_adapter"))
        for _ in range(2):  # the layers are collected once, then reused
            with trainer._reference(model) as reference:
                assert torch.equal(reference(input_ids=ids).logits, expected)
        assert torch.equal(model(input_ids=ids).logits, adapted) and not torch.equal(adapted, expected)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


def test_a_batch_other_than_the_one_scored_beside_the_rewards_gets_the_reference_in_the_loss(tiny_dir, tmp_path):
    """Rebuilt tensors that differ from TRL's batch (a TRL change in how it pads) are not used: the loss computes
    the reference itself."""
    trainer = _trainer(tiny_dir, tmp_path, True, lambda completions, **_: [0.0] * len(completions))
    batch = {"prompt_ids": torch.tensor([[5, 6]]), "prompt_mask": torch.ones(1, 2, dtype=torch.long),
             "completion_ids": torch.tensor([[7, 8]]), "completion_mask": torch.ones(1, 2, dtype=torch.long)}
    output = {**batch, "completion_ids": torch.tensor([[7, 9]])}
    trainer._early_reference = (batch, torch.zeros(1, 2))
    trainer._attach_early_reference(output)
    assert REFERENCE_LOGPS not in output and trainer.references_beside_rewards == 0
    trainer._early_reference = (batch, torch.zeros(1, 2))
    trainer._attach_early_reference(dict(batch))
    assert trainer.references_beside_rewards == 1
