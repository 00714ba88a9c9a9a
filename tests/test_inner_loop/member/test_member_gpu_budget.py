"""A GPU member's caches come from its own GPU budget, never from what the device has free (issue 37, item 6): the
continuous-batching cache, the full form's chunks, and vLLM's context length. CUDA is simulated by monkeypatching what
torch reports; nothing here needs a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen3Config

from inner_loop.config import InnerConfig
from inner_loop.generation.continuous_batching import (GenerationWorkload, bounded_continuous_batching_config,
                                                       member_continuous_batching_config)
from inner_loop.generation.memory import generation_cache_bytes, member_gpu_budget_bytes
from inner_loop.generation.vllm_colocate import member_vllm_max_model_length
from core.records import MEMBER_GPU_MEMORY_KEY, gpus_entry
from test_inner_member import _inner

GIB = 2**30


class _Tokenizer:
    """Token ids of a prompt: one per word (special tokens left out), as the members' tokenizers are called."""

    def __call__(self, text: list[str]) -> dict[str, list[list[int]]]:
        return {"input_ids": [list(range(len(t.split()))) for t in text]}


def _no_free_memory_query(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the device's free memory was asked")

    monkeypatch.setattr(torch.cuda, "mem_get_info", refuse)


def test_vllm_context_is_the_longest_prompt_plus_the_completion_unless_set():
    prompts = ["a " * 300, "b " * 120]
    args = SimpleNamespace(use_vllm=True, vllm_max_model_length=None, max_completion_length=256)
    assert member_vllm_max_model_length(args, _Tokenizer(), prompts) == 300 + 256  # not Qwen3's 40,960
    assert member_vllm_max_model_length(SimpleNamespace(**{**vars(args), "vllm_max_model_length": 1024}),
                                        _Tokenizer(), prompts) == 1024
    assert member_vllm_max_model_length(SimpleNamespace(**{**vars(args), "use_vllm": False}),
                                        _Tokenizer(), prompts) is None


def test_the_continuous_batching_cache_on_a_gpu_is_sized_from_the_members_budget(monkeypatch):
    _no_free_memory_query(monkeypatch)
    config = Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    model = SimpleNamespace(config=config, dtype=torch.float32)
    args = SimpleNamespace(use_vllm=False, device=torch.device("cuda", 0), transformers_continuous_batching_config=None,
                           bf16=True, fp16=False, num_generations=32, max_completion_length=256,
                           generation_batch_size=64)
    prompts = ["w " * 300] * 4
    whole = member_continuous_batching_config(args, model, _Tokenizer(), prompts, member_gpu_budget_bytes(80 * GIB, 1))
    half = member_continuous_batching_config(args, model, _Tokenizer(), prompts, member_gpu_budget_bytes(80 * GIB, 0.5))
    workload = GenerationWorkload(group_size=32, max_prompt_tokens=300, max_completion_tokens=256, requests=64)
    assert whole == bounded_continuous_batching_config(None, config, torch.bfloat16, generation_cache_bytes(80 * GIB),
                                                       workload)
    assert half["num_blocks"] < whole["num_blocks"]  # two members packed on the GPU: each its half
    with pytest.raises(ValueError, match="GPU budget is unknown"):
        member_continuous_batching_config(args, model, _Tokenizer(), prompts, None)


def test_the_members_share_of_its_gpu_reaches_its_config():
    assert gpus_entry({"gpus": 1, MEMBER_GPU_MEMORY_KEY: 0.5}) == {"gpus": 1, MEMBER_GPU_MEMORY_KEY: 0.5}
    assert gpus_entry({"gpus": 0, MEMBER_GPU_MEMORY_KEY: 0.5}) == {}
    assert InnerConfig.from_dict({**_inner(), MEMBER_GPU_MEMORY_KEY: 0.5}).gpu_memory_fraction == 0.5
    assert InnerConfig.from_dict(_inner()).gpu_memory_fraction == 1.0
    with pytest.raises(ValueError, match=r"resources.gpu_memory_fraction=1.5 must be in \(0, 1\]"):
        InnerConfig.from_dict({**_inner(), MEMBER_GPU_MEMORY_KEY: 1.5})
