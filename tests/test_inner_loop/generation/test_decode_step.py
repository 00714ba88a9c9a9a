"""train.decode_cache=persistent_compiled: one static cache per member and one compiled decode step, on the CPU.

Why these checks: the setting pays only if the decode step is compiled once and replayed. A cache made anew at
each call, a weight whose storage moves, or a guard that fails at every step (the embedding hooks gradient
checkpointing leaked did exactly that) would make a GPU record or compile again at every step, which a few timed
steps cannot show. So the cache's tensors are checked by address across calls and steps, dynamo's compiles are
counted (with the ``aot_eager`` backend: the same graphs and guards as inductor, no code generation), greedy
completions must equal the dynamic cache's, and the record must carry the counts a GPU check reads. What the
compiled step contains is inspected too: no copy of the cache per query head (grouped-query attention), no training
hook traced into it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from inner_loop.config import TrainConfig
from inner_loop.generation.decode_step import (PersistentDecoder, bucket_for, decode_counts_problem,
                                               prompt_buckets)
from helpers import inner_config, SMALL_UNWARMED


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


def test_compiles_are_still_counted_after_dynamo_was_reset() -> None:
    """``torch._dynamo.reset()`` (``torch._dynamo.explain`` calls it) clears every compilation callback: the
    decoder's is put back at its next generation, so the compile that follows is counted, not reported as none."""
    model, greedy = _tiny_model()
    decoder = PersistentDecoder(model, [8], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    torch._dynamo.reset()
    ids, mask = _left_padded([5, 7], seed=0)
    with torch.no_grad():
        decoder.generate(model, ids, mask)
    assert decoder.counts.compiles == 1


def _inner(decode_cache: str, **train: Any) -> dict[str, Any]:
    return inner_config("neural_mirror", model_keys={**SMALL_UNWARMED, "lora_r": 4}, **{
        "steps": 10, "batch_size": 8, "group_size": 4, "val_size": 8, "max_completion_length": 6, "report_to": [],
        "decode_cache": decode_cache, "decode_compile_backend": "aot_eager", "save_every": 10, **train})


def _member(tmp_path: Path, name: str, inner: dict[str, Any]) -> Any:
    from inner_loop.member.lifecycle import train_in_process

    return train_in_process({"run_id": "decode", "generation": 0, "index": 0, "seed": 0, "params": [],
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
    # adapter once came from the process's history, not its seed: tests/test_inner_loop/member/test_same_numbers.py)
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


# ---------------------------------------------------------------- grouped-query attention without the cache's copy
def _qwen3(heads: int = 4, kv_heads: int = 2, lora: bool = False) -> Any:
    """A two-layer model of Qwen3's kind (q/k norms, grouped-query heads), tiny; with LoRA and gradient
    checkpointing set up as TRL sets them (the embeddings' input-grad hook), when asked."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
                         max_position_embeddings=128)
    model = Qwen3ForCausalLM(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    greedy = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    return model.eval(), greedy


@pytest.mark.parametrize("per_head_mask", [False, True])
def test_grouped_query_decode_attention_equals_sdpa_over_the_expanded_cache(per_head_mask: bool) -> None:
    """One query token per row over a left-padded, partly filled cache: the packed function against SDPA over the
    repeated keys and values (what the compiled step ran before) and against transformers' eager attention."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    from inner_loop.generation.gqa_attention import gqa_decode_attention

    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 8, 2, 24, 16
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = heads // kv_heads, False
    query = torch.randn(batch, heads, 1, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, length, dim, generator=generator) for _ in range(2))
    mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool)
    for row, (pad, filled) in enumerate([(0, 24), (5, 17), (11, 20)]):  # left padding, then the unfilled tail
        mask[row, ..., pad:filled] = True
    if per_head_mask:
        mask = mask.expand(batch, heads, 1, length).clone()
        mask[:, 1::2, :, 3] = False
    ours, _ = gqa_decode_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    expanded = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, heads // kv_heads), repeat_kv(value, heads // kv_heads), attn_mask=mask,
        scale=dim ** -0.5).transpose(1, 2)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    eager, _ = eager_attention_forward(module, query, key, value, additive, scaling=dim ** -0.5)
    assert ours.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(ours, expanded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-6)
    # a prompt (several query tokens) is transformers' SDPA unchanged
    prompt = torch.randn(batch, heads, 5, dim, generator=generator)
    causal = torch.ones(batch, 1, 5, length, dtype=torch.bool).tril(length - 5)
    assert torch.equal(gqa_decode_attention(module, prompt, key, value, causal, scaling=0.25)[0],
                       sdpa_attention_forward(module, prompt, key, value, causal, scaling=0.25)[0])


def expanded_cache(nodes: list[tuple[str, tuple[int, ...]]], batch: int, heads: int, length: int,
                   dim: int) -> list[tuple[str, tuple[int, ...]]]:
    """The graph nodes (target, shape) that hold the cache expanded to every query head: [batch, heads, length,
    head dim] elements in any layout (repeat_kv's 5-D expand and copy, or its 4-D view)."""
    return [(target, shape) for target, shape in nodes
            if shape[-2:] == (length, dim) and math.prod(shape) == batch * heads * length * dim]


def _decode_graph_tensors(model: Any, greedy: Any, monkeypatch: pytest.MonkeyPatch,
                          sdpa: bool = False) -> tuple[PersistentDecoder, list[tuple[str, tuple[int, ...]]]]:
    """Decode once over the persistent cache with a backend that records every node of the decode step's
    ATen graph (what inductor receives) with its shape; ``sdpa``: with transformers' SDPA attention instead."""
    from contextlib import nullcontext

    from torch._dynamo.backends.common import aot_autograd

    import inner_loop.generation.decode_step as decode_step

    if sdpa:
        monkeypatch.setattr(decode_step, "decode_attention", lambda model: nullcontext())
    decoder = PersistentDecoder(model, [8, 16], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    nodes: list[tuple[str, tuple[int, ...]]] = []

    def record(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        nodes.extend((str(n.target), tuple(n.meta["val"].shape)) for n in graph.graph.nodes
                     if isinstance(n.meta.get("val"), torch.Tensor))
        return graph.forward

    decoder.generation_config.compile_config.backend = aot_autograd(fw_compiler=record)
    ids, mask = _left_padded([5, 11], seed=0)
    with torch.no_grad():
        decoder.generate(model, ids, mask)
    return decoder, nodes


def test_the_compiled_decode_step_attends_grouped_heads_without_expanding_the_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode step's graph holds the cache at [batch, kv heads, length, head dim] only: no tensor of
    [batch, heads, length, head dim] (repeat_kv's copy, per layer and token step). The same check over
    transformers' SDPA path finds that copy, so it can fail; both decode the same greedy tokens."""
    model, greedy = _qwen3(heads=4, kv_heads=2)
    heads, dim = model.config.num_attention_heads, model.config.head_dim
    decoder, ours = _decode_graph_tensors(model, greedy, monkeypatch)
    batch, length = decoder.batch_size, decoder.max_cache_len

    def copies(nodes: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
        return expanded_cache(nodes, batch, heads, length, dim)

    assert ours and decoder.counts.compiles == 1
    assert copies(ours) == []
    assert any(shape == (batch, 2, length, dim) for _, shape in ours)  # the cache itself is in the graph
    assert model.config._attn_implementation == "sdpa"  # switched for the generation only
    sdpa_model, _ = _qwen3(heads=4, kv_heads=2)
    _, theirs = _decode_graph_tensors(sdpa_model, greedy, monkeypatch, sdpa=True)
    assert any(target == "aten.clone.default" for target, _ in copies(theirs)), copies(theirs)
    ids, mask = _left_padded([5, 11], seed=1)
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(decoder.generate(model, ids, mask), plain)


# ---------------------------------------------------------------- no training hook inside the decode step
def _decode_step_inputs(model: Any, rows: int = 2, prompt: int = 8) -> dict[str, Any]:
    """A prefilled static cache and the inputs of the next token step, as generate passes them."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=prompt + 8)
    ids = torch.randint(1, 64, (rows, prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return {"input_ids": ids[:, -1:], "past_key_values": cache, "cache_position": torch.tensor([prompt]),
            "position_ids": torch.full((rows, 1), prompt), "attention_mask": torch.ones(rows, prompt + 1,
                                                                                     dtype=torch.long),
            "use_cache": True}


def _hook_nodes(explanation: Any) -> list[str]:
    return [str(n.target) for graph in explanation.graphs for n in graph.graph.nodes if "requires_grad" in str(n.target)]


def test_the_input_grad_hook_is_lifted_while_decoding_and_back_for_training() -> None:
    """TRL registers the embeddings' input-grad hook for LoRA with gradient checkpointing; while the persistent
    decoder decodes it is off the model (one graph, no break, no ``requires_grad_`` traced into it), and after the
    same hook is back, so a checkpointed training step still gets its LoRA gradients."""
    from inner_loop.generation.decode_step import input_grad_hooks

    model, greedy = _qwen3(lora=True)
    hooks = [(module, key, module._forward_hooks[key]) for module, key in input_grad_hooks(model)]
    assert hooks
    step = _decode_step_inputs(model)
    with torch.no_grad():
        live = torch._dynamo.explain(model)(**step)
    assert _hook_nodes(live)  # without lifting it, the hook runs inside the compiled step
    decoder = PersistentDecoder(model, [8], batch_size=2, max_new_tokens=6, generation_config=greedy,
                                compile_backend="aot_eager")
    with torch.no_grad(), decoder.decoding(model):
        assert input_grad_hooks(model) == []
        explanation = torch._dynamo.explain(model)(**_decode_step_inputs(model))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    assert _hook_nodes(explanation) == []
    ids, mask = _left_padded([5, 7], seed=0)
    with torch.no_grad():
        decoder.generate(model, ids, mask)
    assert [(m, k, m._forward_hooks[k]) for m, k in input_grad_hooks(model)] == hooks
    model.train()
    lora = [p for name, p in model.named_parameters() if "lora_" in name]
    model(input_ids=ids, labels=ids).loss.backward()  # reentrant checkpointing: grads only through the hook
    assert all(p.grad is not None for p in lora) and any(float(p.grad.abs().sum()) > 0 for p in lora)


# ---------------------------------------------------------------- counts that mean it; static_compiled refused
def test_a_second_recording_of_one_graph_fails_whatever_the_buckets() -> None:
    """The decode step's graph does not depend on the prompt's bucket, so two buckets used do not allow a second
    recording of one compiled graph."""
    counts = {"generate_calls": 10, "compiles": 1, "recompiles": 0, "cudagraph_recordings": 2, "weights_moved": 0,
              "buckets": [8, 16], "buckets_used": {"8": 6, "16": 4}, "cache_kept": True,
              "compile_mode": "reduce-overhead", "cudagraph_skips": 0}
    record = {"generation": {"decode_cache": "persistent_compiled", "decode_counts": counts}}
    assert "2 CUDA graph recordings" in decode_counts_problem(record)
    assert decode_counts_problem({"generation": {**record["generation"],
                                                 "decode_counts": {**counts, "cudagraph_recordings": 1}}}) is None


def test_static_compiled_is_refused_up_front_naming_persistent_compiled() -> None:
    with pytest.raises(ValueError, match=r"train.decode_cache='static_compiled' is refused: .*recorded again at "
                                         r"every generation.*re-record limit.*persistent_compiled"):
        TrainConfig(decode_cache="static_compiled").validate()
