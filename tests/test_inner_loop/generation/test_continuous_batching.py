"""transformers' continuous batching in a member: the paged cache is sized from the member's own memory budget.

The sizing (inner_loop/generation/continuous_batching.py) is checked against transformers' own code: its block
size, and its footprint check run with the budget as the memory available; then one real tiny member trains on
the CPU with continuous batching and the cache transformers actually built is the bounded one.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from inner_loop.generation.continuous_batching import (CONFIG_KEY, GenerationWorkload,
                                                       bounded_continuous_batching_config, bytes_per_block)

_MIB = 1 << 20


def _tiny_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2)


def _qwen3_1_7b_config() -> Qwen3Config:
    """Qwen3-1.7B's shapes (28 layers, 8 KV heads of 128), with SDPA as a CPU member runs it."""
    config = Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    config._attn_implementation = "sdpa"
    return config


def _transformers_footprint_ok(config: Any, dtype: torch.dtype, sized: dict[str, Any], budget: int,
                               monkeypatch: pytest.MonkeyPatch, logits_to_keep: bool) -> tuple[int, int]:
    """(footprint, cache blocks) as transformers computes them when given ``sized`` with ``budget`` bytes available:
    its own check (``_check_footprint``, MemoryError above the budget) on the sectors it derives from num_blocks."""
    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb_cache

    monkeypatch.setattr(cb_cache, "get_device_and_memory_breakdown", lambda: ("cpu", budget, 0, 0))
    cb = ContinuousBatchingConfig(**sized, max_memory_percent=1.0)
    cb.max_requests_per_batch = cb.max_requests_per_batch or 16
    groups = cb_cache.group_layers_by_attn_type(config)
    assert list(groups) == ["full_attention"]  # one allocator: sectors of whole-model blocks
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    block = config.num_hidden_layers * cb_cache.FullAttentionCacheAllocator.get_bytes_per_page(
        config.num_key_value_heads, head_dim, dtype, cb.page_size)
    sector = math.lcm(block, 128)
    handler = cb_cache.PagedAttentionMemoryHandler(
        config=config, cb_config=cb, dtype=dtype, bytes_per_sector=sector,
        tokens_per_sector=sector // block * cb.page_size, bytes_per_block=block, attn_types=list(groups),
        model_supports_logits_to_keep=logits_to_keep)
    assert handler.available_memory == budget
    batch_tokens, sectors = handler.infer_max_batch_tokens_and_num_sectors()  # raises above the budget
    assert batch_tokens == sized["max_batch_tokens"]
    return handler.compute_memory_footprint(batch_tokens, sectors), sectors * sector // block


def test_bytes_per_block_is_transformers_block():
    from transformers.generation.continuous_batching.cache_allocators import FullAttentionCacheAllocator

    for config, dtype in ((_tiny_config(), torch.float32), (_qwen3_1_7b_config(), torch.bfloat16)):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theirs = config.num_hidden_layers * FullAttentionCacheAllocator.get_bytes_per_page(
            config.num_key_value_heads, head_dim, dtype, 256)
        assert bytes_per_block(config, dtype, 256) == theirs == (
            2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 256 * dtype.itemsize)
    assert bytes_per_block(_qwen3_1_7b_config(), torch.bfloat16, 256) == 28 * _MIB  # 112 KiB a token


@pytest.mark.parametrize("budget_mib", [64, 256, 1024])
@pytest.mark.parametrize("model", ["tiny", "qwen3_1_7b"])
def test_sized_cache_fits_the_budget_as_transformers_counts_it(model, budget_mib, monkeypatch):
    config, dtype = ((_tiny_config(), torch.float32) if model == "tiny" else (_qwen3_1_7b_config(), torch.bfloat16))
    workload = (GenerationWorkload(group_size=8, max_prompt_tokens=12, max_completion_tokens=8, requests=256)
                if model == "tiny" else
                GenerationWorkload(group_size=2, max_prompt_tokens=200, max_completion_tokens=56, requests=16))
    budget = budget_mib * _MIB
    try:
        sized = bounded_continuous_batching_config(None, config, dtype, budget, workload,
                                                   supports_logits_to_keep=True)
    except ValueError:  # Qwen3-1.7B's bf16 blocks are 28 MiB: 64 MiB cannot hold its batch beside a group
        assert (model, budget_mib) == ("qwen3_1_7b", 64)
        return
    assert set(sized) == {"num_blocks", "max_batch_tokens"}
    footprint, blocks = _transformers_footprint_ok(config, dtype, sized, budget, monkeypatch, logits_to_keep=True)
    assert footprint <= budget and blocks == sized["num_blocks"]
    assert sized["num_blocks"] * bytes_per_block(config, dtype, 256) <= budget
    one_group = workload.group_size * math.ceil((workload.max_prompt_tokens + workload.max_completion_tokens) / 256)
    assert sized["num_blocks"] >= one_group


def test_user_settings_win_and_are_kept(monkeypatch):
    workload = GenerationWorkload(group_size=4, max_prompt_tokens=10, max_completion_tokens=6, requests=16)
    for user in ({"num_blocks": 7}, {"max_memory_percent": 0.2, "page_size": 64}):
        assert bounded_continuous_batching_config(user, _tiny_config(), torch.float32, 64 * _MIB,
                                                  workload) == user
    user = {"max_batch_tokens": 128, "page_size": 64, "allow_block_sharing": False}
    sized = bounded_continuous_batching_config(user, _tiny_config(), torch.float32, 64 * _MIB, workload)
    assert {k: sized[k] for k in user} == user and sized["num_blocks"] > 0
    footprint, _ = _transformers_footprint_ok(_tiny_config(), torch.float32, sized, 64 * _MIB, monkeypatch,
                                              logits_to_keep=False)
    assert footprint <= 64 * _MIB
    with pytest.raises(ValueError, match=rf"{CONFIG_KEY}:.*block_sise"):
        bounded_continuous_batching_config({"block_sise": 16}, _tiny_config(), torch.float32, 64 * _MIB, workload)


def test_a_budget_without_room_for_one_group_is_refused():
    workload = GenerationWorkload(group_size=8, max_prompt_tokens=300, max_completion_tokens=512, requests=256)
    with pytest.raises(ValueError, match=rf"{CONFIG_KEY}: .*256 MiB cannot hold one group's prompt \+ completion "
                                         r"tokens \(8 x \(300 \+ 512\) tokens, 32 cache blocks"):
        bounded_continuous_batching_config(None, _qwen3_1_7b_config(), torch.bfloat16, 256 * _MIB, workload)
    with pytest.raises(ValueError, match=r"max_batch_tokens=4096\)"):  # a user's batch size is not shrunk
        bounded_continuous_batching_config({"max_batch_tokens": 4096}, _tiny_config(), torch.float32, _MIB,
                                           GenerationWorkload(group_size=2, max_prompt_tokens=8,
                                                              max_completion_tokens=8, requests=2))


def test_a_tiny_member_trains_with_continuous_batching_in_its_budget(tmp_path: Path, monkeypatch):
    """A real member on the CPU, TRL's generate_batch path, with a 1 GiB SLURM allocation: the paged cache
    transformers builds at every step is the one sized from that allocation's budget, not half the machine."""
    from transformers.generation.continuous_batching import continuous_api

    import inner_loop.generation.continuous_batching as cb_module
    from conf_groups import load_group
    from inner_loop.generation.memory import generation_cache_bytes, member_memory_bytes
    from inner_loop.member.lifecycle import train_in_process

    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")  # MiB, as SLURM writes it
    budget = generation_cache_bytes(member_memory_bytes())
    built: list[Any] = []
    sized: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Recorded(continuous_api.PagedAttentionCache):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    def recorded_sizing(*args: Any, **kwargs: Any) -> dict[str, Any]:
        sized.append((args, real_sizing(*args, **kwargs)))
        return sized[-1][1]

    real_sizing = cb_module.bounded_continuous_batching_config
    monkeypatch.setattr(continuous_api, "PagedAttentionCache", Recorded)
    monkeypatch.setattr(cb_module, "bounded_continuous_batching_config", recorded_sizing)
    inner = {"task": load_group("task", "arith"), "model": load_group("model", "tiny"),
             "divergence": load_group("divergence", "prob_l2"), "train": load_group("train", "default")}
    inner["model"].update({"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                           "warmup_max_steps": 0})
    inner["train"].update({"steps": 2, "batch_size": 8, "group_size": 4, "val_size": 8, "max_completion_length": 6,
                           "report_to": [], "trl": {"use_transformers_continuous_batching": True}})
    record = train_in_process({"run_id": "cb", "generation": 0, "index": 0, "seed": 0, "params": [],
                           "work_dir": str(tmp_path / "m"), "inner": inner})

    assert record.status == "ok", record.error
    assert record.steps_done == 2 and math.isfinite(record.fitness) and 0.0 <= record.fitness <= 1.0
    [((user, config, dtype, sized_budget, workload), expected)] = sized
    assert user is None and dtype == torch.float32 and sized_budget == budget == 256 * _MIB
    assert workload.group_size == 4 and workload.max_completion_tokens == 6 and workload.requests == 8
    assert 6 <= workload.max_prompt_tokens <= 8  # "07+38=" in character tokens
    assert len(built) == 2  # one generate_batch, so one paged cache, per step
    block = bytes_per_block(config, torch.float32, 256)
    for cache in built:
        assert cache.num_blocks == expected["num_blocks"] and cache.max_batch_tokens == expected["max_batch_tokens"]
        assert cache.cache_tensor.numel() * cache.cache_tensor.element_size() <= budget
        assert cache.cache_tensor.numel() == (cache.num_blocks + 2) * block  # + transformers' two trash sectors
    unbounded = real_sizing(None, config, torch.float32, generation_cache_bytes(None), workload,
                            supports_logits_to_keep=True)
    assert unbounded["num_blocks"] != expected["num_blocks"]  # the cache follows the member's allocation
    # the record names the backend, and the same seed reproduces the same completions with it
    assert record.generation["backend"] == "transformers_continuous_batching"
    again = train_in_process({"run_id": "cb", "generation": 0, "index": 0, "seed": 0, "params": [],
                          "work_dir": str(tmp_path / "again"), "inner": inner})
    assert again.generation["completions_sha256"] == record.generation["completions_sha256"]
