"""train.decode_cache=persistent_compiled: one static cache per member and one compiled decode step, on the CPU.

Why these checks: the setting pays only if the decode step is compiled once and replayed. A cache made anew at
each call, a weight whose storage moves, or a guard that fails at every step (the embedding hooks gradient
checkpointing leaked did exactly that) would make a GPU record or compile again at every step, which a few timed
steps cannot show. So the cache's tensors are checked by address across calls and steps, dynamo's compiles are
counted (with the ``aot_eager`` backend: the same graphs and guards as inductor, no code generation), greedy
completions must equal the dynamic cache's, and the record must carry the counts a GPU check reads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from conf_groups import load_group
from inner_loop.config import TrainConfig
from inner_loop.generation.decode_step import (PersistentDecoder, bucket_for, decode_counts_problem,
                                               prompt_buckets)

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "warmup_max_steps": 0}


def _tiny_model() -> Any:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    greedy = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    return model, greedy


def _left_padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, 64, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids, mask


def _dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def test_buckets_cover_every_prompt_and_stay_few() -> None:
    lengths = [3, 5, 9, 17, 17, 30, 41, 70]
    buckets = prompt_buckets(lengths, 4)
    assert 1 <= len(buckets) <= 4 and buckets == sorted(buckets)
    assert all(b % 8 == 0 for b in buckets) and buckets[-1] >= max(lengths)
    assert all(bucket_for(n, buckets) >= n for n in lengths)
    assert prompt_buckets([5, 6, 7], 4) == [8]  # close lengths share one bucket
    with pytest.raises(ValueError, match="longer than the longest decode bucket"):
        bucket_for(max(buckets) + 1, buckets)
    with pytest.raises(ValueError, match="train.decode_buckets must be >= 1"):
        prompt_buckets(lengths, 0)


def test_one_cache_reset_in_place_no_recompile_inside_a_bucket_and_greedy_equals_dynamic() -> None:
    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8, 16], batch_size=4, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    cache, addresses = decoder.cache, decoder.cache_data_ptrs()
    frames = _dynamo_frames()

    def both(lengths: list[int], seed: int) -> None:
        ids, mask = _left_padded(lengths, seed)
        with torch.no_grad():
            ours = decoder.generate(model, ids, mask)
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(ours, plain)  # the same completions as HF's dynamic cache
        assert decoder.cache is cache and decoder.cache_data_ptrs() == addresses

    both([5, 3, 7, 6], seed=0)
    first = decoder.counts.compiles
    assert first >= 1 and _dynamo_frames() - frames == first  # compiled once, and counted
    both([4, 2, 8, 1], seed=1)  # another longest prompt, the same bucket (8)
    both([3, 3], seed=2)  # fewer rows than the cache holds: filled up, dropped after
    assert decoder.counts.compiles == first and decoder.counts.recompiles == 0
    both([12, 9, 16, 10], seed=3)  # the next bucket: the decode step's shapes do not depend on the prompt
    assert decoder.counts.recompiles == 0
    summary = decoder.summary()
    assert summary["generate_calls"] == 4 and summary["buckets_used"] == {"8": 3, "16": 1}
    assert summary["cache_kept"] and summary["cache_shape"] == [4, 16 + 6]
    assert summary["cudagraph_recordings"] is None  # no CUDA here: not measured, not zero


def _greedy_margin(model: Any, greedy: Any, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """The smallest gap between the two likeliest tokens along the dynamic cache's greedy path."""
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy, output_scores=True,
                             return_dict_in_generate=True)
    return min(float((s.topk(2).values[:, 0] - s.topk(2).values[:, 1]).min()) for s in out.scores)


def test_inductor_generates_the_decode_step_once_and_decodes_as_the_eager_model() -> None:
    """The real backend (inductor writes and compiles C++ for the CPU as it writes Triton for a GPU): its kernels
    round differently from eager ones (~1e-6 in float32), so greedy tokens are compared only where the eager path's
    top two logits stand apart by far more than that (checked, not assumed)."""
    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8, 16], batch_size=4, max_new_tokens=6, generation_config=greedy,
                                compile_backend="inductor")
    addresses = decoder.cache_data_ptrs()
    for seed, lengths in enumerate(([5, 3, 7, 6], [4, 2, 8, 1], [12, 9, 16, 10])):
        ids, mask = _left_padded(lengths, seed)
        assert _greedy_margin(model, greedy, ids, mask) > 1e-4  # a tie would make the comparison about rounding
        with torch.no_grad():
            ours = decoder.generate(model, ids, mask)
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(ours, plain), (seed, ours, plain)
    summary = decoder.summary()
    assert summary["compile_backend"] == "inductor" and summary["compiles"] == 1 and summary["recompiles"] == 0
    assert summary["cache_kept"] and decoder.cache_data_ptrs() == addresses


def test_a_decode_step_inductor_compiles_without_cuda_graphs_is_named() -> None:
    """``reduce-overhead`` is what removes the launches on a GPU, and inductor silently falls back to launching each
    kernel when it cannot graph a step (a CPU op, an unmarked input mutated in place): counted and refused. On the CPU
    every graph is such a fallback, which is how this is tested without a GPU."""
    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="inductor", compile_mode="reduce-overhead")
    ids, mask = _left_padded([5, 7], seed=0)
    with torch.no_grad():
        decoder.generate(model, ids, mask)
    summary = decoder.summary()
    assert summary["compile_mode"] == "reduce-overhead" and summary["cudagraph_skips"] >= 1
    assert "compiled without CUDA graphs" in decode_counts_problem(
        {"generation": {"decode_cache": "persistent_compiled", "decode_counts": summary}})


def test_an_in_place_weight_update_keeps_the_address_and_a_moved_weight_is_counted() -> None:
    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    ids, mask = _left_padded([5, 7], seed=0)
    weight = model.model.layers[0].self_attn.q_proj.weight
    address = weight.data_ptr()
    with torch.no_grad():
        decoder.generate(model, ids, mask)
        weight.add_(0.01)  # in place, as the optimizer updates it
        decoder.generate(model, ids, mask)
    assert weight.data_ptr() == address and decoder.counts.weights_moved == 0
    weight.data = weight.data.clone()  # storage moved: a captured graph would have to record again
    with torch.no_grad():
        decoder.generate(model, ids, mask)
    assert decoder.counts.weights_moved == 1
    assert "moved in memory" in decode_counts_problem(
        {"generation": {"decode_cache": "persistent_compiled", "decode_counts": decoder.summary()}})


def test_recompiles_and_recordings_are_counted_from_torchs_callbacks() -> None:
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    # what dynamo (a frame compiled, then compiled again) and cudagraph trees (a recording) report while decoding
    with decoder._counting():
        for trigger, compile_id in ((CallbackTrigger.DYNAMO, "41/0"), (CallbackTrigger.DYNAMO, "41/1"),
                                    (CallbackTrigger.CUDAGRAPH_RECORDING, "41/1")):
            with callback_handler.install_callbacks(trigger, compile_id):
                pass
    with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "42/0"):  # not decoding: not ours
        pass
    counts = decoder.counts
    assert (counts.compiles, counts.recompiles, counts.cudagraph_recordings) == (2, 1, 1)


def _inner(decode_cache: str, **train: Any) -> dict[str, Any]:
    inner = {"task": load_group("task", "arith"), "model": {**load_group("model", "tiny"), **TINY, "lora_r": 4},
             "divergence": load_group("divergence", "neural_mirror"), "train": load_group("train", "default")}
    inner["train"].update({"steps": 10, "batch_size": 8, "group_size": 4, "val_size": 8, "max_completion_length": 6,
                           "report_to": [], "decode_cache": decode_cache, "decode_compile_backend": "aot_eager",
                           "save_every": 10, **train})
    return inner


def _member(tmp_path: Path, name: str, inner: dict[str, Any]) -> Any:
    from inner_loop.member.lifecycle import train_member

    return train_member({"run_id": "decode", "generation": 0, "index": 0, "seed": 0, "params": [],
                         "work_dir": str(tmp_path / name), "inner": inner})


def test_a_lora_member_compiles_once_over_ten_steps_and_a_seed_reproduces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inner_loop.tasks.arith import ArithTask

    # a reward the untrained model varies on, so the adapter moves between generations (in place, or counted)
    monkeypatch.setattr(ArithTask, "score", lambda self, problem, completion:
                        sum(c.isdigit() for c in completion) / max(len(completion), 1))
    frames = _dynamo_frames()
    first = _member(tmp_path, "first", _inner("persistent_compiled"))
    assert first.status == "ok", first.error
    counts = first.generation["decode_counts"]
    assert first.steps_done == 10 and counts["generate_calls"] == 10
    # at most one compile per bucket used, none again; and nothing else compiled: the policy's and the
    # reference's log-prob passes (the adapter disabled) stayed eager
    assert counts["compiles"] <= len(counts["buckets_used"]) and counts["recompiles"] == 0
    assert _dynamo_frames() - frames == counts["compiles"]
    assert counts["cache_kept"] and counts["weights_moved"] == 0
    assert decode_counts_problem({"generation": first.generation}) is None
    stored = json.loads((tmp_path / "first" / "result.json").read_text())
    assert stored["generation"]["decode_counts"]["compiles"] == counts["compiles"]  # in the record on disk
    # a seed reproduces its completions over all ten steps, also against the process's first member (whose LoRA
    # adapter once came from the process's history, not its seed: tests/test_same_numbers.py)
    two = _member(tmp_path, "two", _inner("persistent_compiled"))
    assert two.status == "ok", two.error
    assert first.generation["completions_sha256"] == two.generation["completions_sha256"]


def test_a_member_trains_with_the_decode_step_inductor_generated(tmp_path: Path) -> None:
    """The preset's backend end to end on the CPU: a LoRA member with the neural mirror divergence, its decode step
    compiled by inductor once per bucket used and replayed, and the record saying so."""
    record = _member(tmp_path, "inductor", _inner("persistent_compiled", steps=4, save_every=4,
                                                  decode_compile_backend="inductor"))
    assert record.status == "ok", record.error
    counts = record.generation["decode_counts"]
    assert record.steps_done == 4 and counts["generate_calls"] == 4
    assert counts["compile_backend"] == "inductor" and counts["compile_mode"] == "default"
    assert 1 <= counts["compiles"] <= len(counts["buckets_used"]) and counts["recompiles"] == 0
    assert decode_counts_problem({"generation": record.generation}) is None


def test_greedy_member_completions_equal_the_dynamic_caches(tmp_path: Path) -> None:
    greedy = {"steps": 2, "save_every": 2, "trl": {"generation_kwargs": {"do_sample": False}}}
    records = {cache: _member(tmp_path, cache, _inner(cache, **greedy))
               for cache in ("dynamic", "persistent_compiled")}
    assert all(r.status == "ok" for r in records.values()), {c: r.error for c, r in records.items()}
    assert records["dynamic"].generation["decode_counts"] is None
    assert (records["persistent_compiled"].generation["completions_sha256"]
            == records["dynamic"].generation["completions_sha256"])


def test_decode_counts_problem_names_what_went_wrong() -> None:
    good = {"generate_calls": 10, "compiles": 1, "recompiles": 0, "cudagraph_recordings": 1, "weights_moved": 0,
            "buckets": [8, 16], "buckets_used": {"8": 10}, "cache_kept": True}

    def problem(**change: Any) -> str | None:
        return decode_counts_problem({"generation": {"decode_cache": "persistent_compiled",
                                                     "decode_counts": {**good, **change}}})

    assert problem() is None
    assert decode_counts_problem({"generation": {"decode_cache": "dynamic", "decode_counts": None}}) is None
    assert "no decode_counts" in decode_counts_problem({"generation": {"decode_cache": "persistent_compiled"}})
    assert "recorded again" in problem(cudagraph_recordings=10)
    assert "recompiles" in problem(recompiles=5)
    assert "moved" in problem(cache_kept=False)
    assert "no generation" in problem(generate_calls=0)
    cuda_graphs = {"compile_mode": "reduce-overhead", "cudagraph_skips": 0}
    assert problem(**cuda_graphs) is None
    assert "without CUDA graphs (2 graph(s) skipped" in problem(**{**cuda_graphs, "cudagraph_skips": 2})
    assert "no CUDA graph was ever recorded" in problem(**cuda_graphs, cudagraph_recordings=0)


def test_the_keys_are_checked_up_front_naming_them() -> None:
    with pytest.raises(ValueError, match=r"train.decode_buckets must be >= 1"):
        TrainConfig(decode_cache="persistent_compiled", decode_buckets=0).validate()
    with pytest.raises(ValueError, match=r"train.decode_compile_backend='inductr' is not one of"):
        TrainConfig(decode_compile_backend="inductr").validate()
    with pytest.raises(ValueError, match=r"train.decode_cache='persistent_compiled' applies to HF generate only"):
        TrainConfig(decode_cache="persistent_compiled", trl={"use_vllm": True}).validate()
