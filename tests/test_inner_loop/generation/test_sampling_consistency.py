"""One policy whichever backend: vLLM's importance-sampling ratio compared on the distribution the sampler drew from.

Why: under a preset's top_p < 1, TRL compared the trainer's full-vocabulary log-probs with vLLM's processed (nucleus
renormalised) ones, so the ratio measured the truncation (mean 0.28 in the SmolLM2 rehearsal, sequences masked),
while HF generate, sampling the same truncated distribution, corrected nothing. Here a real member trainer meets a
perfect sampler (HF generate with each preset's sampling, its processed scores as the sampler's log-probs, which is
what vLLM's ``processed_logprobs`` are): the ratio the trainer hands the loss must be 1 within 0.02 with no sequence
masked, while TRL's full-vocabulary comparison is shown to be off where the preset truncates. Presets whose
sampling the trainer cannot rebuild are refused up front. The same check with vLLM itself runs in
tests/test_inner_loop/generation/test_vllm_member.py where vLLM is installed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conf_groups import PRESETS, preset_sampling
from inner_loop.config import DivergenceConfig, ModelConfig, TrainConfig
from inner_loop.generation.sampling import importance_sampling_ratio, processed_logps, truncated_logits
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from inner_loop.loss.regularizers import build_regularizer
from inner_loop.models.loading import load_policy
from helpers import SMALL_SHAPE


def _trainer(tiny_dir: str, tmp_path: Path, temperature: float, top_p: float, top_k: int) -> tuple[Any, Any]:
    from datasets import Dataset
    from trl import GRPOConfig

    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(**SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, beta=0.0, report_to=[], use_cpu=True, max_steps=1, bf16=False,
                      temperature=temperature, top_p=top_p, top_k=top_k)
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}),
                                processing_class=tok, regularizer=build_regularizer(DivergenceConfig(name="none",
                                                                                                     coef=0.0)))
    trainer.model.train()
    return trainer, tok


def _perfect_sampler(model: Any, temperature: float, top_p: float, top_k: int) -> dict[str, torch.Tensor]:
    """A batch sampled by HF generate with this sampling, and its log-probs under the processed distribution it was
    drawn from (the scores after temperature, top_k and top_p): a sampler that is exactly the policy."""
    torch.manual_seed(1)
    prompt_ids = torch.randint(3, model.config.vocab_size, (16, 5))
    with torch.no_grad():
        out = model.generate(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=top_k or None, max_new_tokens=8,
                             min_new_tokens=8, eos_token_id=None, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    completion_ids = out.sequences[:, prompt_ids.size(1):]
    scores = torch.stack(out.scores, dim=1)  # (B, T, V), processed
    sampler = torch.log_softmax(scores.float(), dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
            "completion_mask": torch.ones_like(completion_ids), "sampling_per_token_logps": sampler}


@pytest.mark.parametrize("preset", PRESETS)
def test_under_each_presets_sampling_the_ratio_is_one_and_nothing_is_masked(tiny_dir: str, tmp_path: Path,
                                                                             preset: str) -> None:
    temperature, top_p, top_k = preset_sampling(preset)
    trainer, _ = _trainer(tiny_dir, tmp_path, temperature, top_p, top_k)
    batch = _perfect_sampler(trainer.model, temperature, top_p, top_k)
    trainer._metrics["train"]["sampling/importance_sampling_ratio/mean"].append(float("nan"))  # TRL's entry
    output = dict(batch)
    trainer._ratio_on_processed_distribution(output)
    ratio = output["importance_sampling_ratio"]
    assert trainer.vllm_importance_sampling_mode == "sequence_mask"  # TRL's default, the one the presets get
    assert ratio.shape == (16, 1) and bool((ratio > 0).all())  # no sequence masked
    assert abs(ratio.mean().item() - 1.0) < 0.02
    assert abs(trainer._metrics["train"]["sampling/importance_sampling_ratio/mean"][-1] - 1.0) < 0.02
    # TRL's own comparison: the policy's full-vocabulary log-probs against the processed ones
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    with torch.no_grad():
        logits = trainer._completion_logits(trainer.model, ids, torch.ones_like(ids), 8)
    full = torch.log_softmax(logits, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    trl_ratio = importance_sampling_ratio(full, batch["sampling_per_token_logps"], batch["completion_mask"].float(),
                                          "sequence_mask", trainer.vllm_importance_sampling_clip_min,
                                          trainer.vllm_importance_sampling_clip_max)
    if top_p < 1.0 or top_k:
        assert trl_ratio.mean().item() < 0.9  # what the presets trained with vLLM before
    else:
        assert abs(trl_ratio.mean().item() - 1.0) < 0.02  # nothing truncated: the two comparisons agree


def test_truncation_follows_transformers_warpers() -> None:
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    for top_p, top_k in ((0.9, 0), (0.5, 0), (1.0, 7), (0.8, 10), (0.01, 0)):
        expected = logits.clone()
        if top_k:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1.0:
            expected = TopPLogitsWarper(top_p)(None, expected)
        assert torch.equal(torch.isinf(truncated_logits(logits, top_p, top_k)), torch.isinf(expected))
    kept = processed_logps(logits[None], torch.argmax(logits, dim=-1)[None], 0.01, 0)
    assert torch.allclose(kept, torch.zeros_like(kept))  # the nucleus of one token: probability 1


def test_sampling_the_trainer_cannot_rebuild_is_refused_with_vllm_naming_the_key() -> None:
    vllm = {"use_vllm": True, "vllm_mode": "colocate"}
    with pytest.raises(ValueError, match=r"train.trl.min_p=0.1 with vLLM generation.*"
                                         r"vllm_importance_sampling_correction=false"):
        TrainConfig(trl={**vllm, "min_p": 0.1}).validate()
    with pytest.raises(ValueError, match=r"train.trl.repetition_penalty=1.1"):
        TrainConfig(trl={**vllm, "repetition_penalty": 1.1}).validate()
    with pytest.raises(ValueError, match=r"train.trl.generation_kwargs.logit_bias with vLLM generation"):
        TrainConfig(trl={**vllm, "generation_kwargs": {"logit_bias": {"5": 2.0}, "stop": ["\n"]}}).validate()
    TrainConfig(trl={**vllm, "generation_kwargs": {"stop": ["\n"]}}).validate()  # stops change no distribution
    TrainConfig(trl={**vllm, "min_p": 0.1, "vllm_importance_sampling_correction": False}).validate()
    TrainConfig(trl={"min_p": 0.1}).validate()  # HF generate samples and trains with it alike
    TrainConfig(top_p=0.9, trl={**vllm, "top_k": 20}).validate()  # rebuilt: allowed
