"""train.decode_cache=owned_loop (and persistent_merged) on the CPU: the project's own decode loop samples the
distribution the trainer trains, compiles its step once, and never syncs the host per token.

Why these checks: a sampler that drew from another distribution than the one the trainer rebuilds (a missed
truncation, a temperature applied twice) would train another policy with nothing failing, and a host read per token
would bring back the stall the loop exists to remove. So: a chi-square of 200,000 in-loop draws against
``torch.multinomial`` on the processed distribution, greedy tokens equal to the dynamic cache's, the importance
ratio between the loop's processed log-probs and the training forward's within 1 +- 0.005, seeds, host reads counted
by patching torch's own, and compiles/recordings counted (``aot_eager``: dynamo's graphs and guards, no code
generation, so the compile stays short).
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from inner_loop.config import TrainConfig
from inner_loop.generation.decode_step import decode_counts_problem, loop_counts_problem
from inner_loop.generation.owned_loop import OwnedDecoder, processed_scores
from inner_loop.generation.sampling import processed_logps
from test_decode_step import _inner, _left_padded, _member, _tiny_model

SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": None}


def _config(max_new_tokens: int, eos: int | None = None, **sampling: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=eos, **sampling)


def _constant_model() -> Any:
    """A tiny Llama whose next-token distribution is the same at every position and for every context: every
    token embeds to one vector and no block writes to the residual stream, so the logits are lm_head(norm(v))."""
    model, _ = _tiny_model()
    with torch.no_grad():
        vector = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(3))
        model.model.embed_tokens.weight.copy_(vector.expand_as(model.model.embed_tokens.weight))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.mul_(10.0)  # logits spread enough that top_p drops a good part of the vocabulary
    return model


def _lora_model() -> Any:
    from peft import LoraConfig, get_peft_model

    model, _ = _tiny_model()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # an adapter that has trained: B != 0, so merging changes the weights
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model.eval()


def _chi2_sf(statistic: float, dof: int) -> float:
    from scipy.stats import chi2

    return float(chi2.sf(statistic, dof))


def test_200000_in_loop_draws_follow_the_processed_distribution(one_thread: Any) -> None:
    model = _constant_model()
    rows, steps = 2000, 101
    decoder = OwnedDecoder(model, [8], rows, steps, _config(steps, **SAMPLING), compile_backend="aot_eager",
                           check_every=64)
    ids, mask = _left_padded([5] * rows, seed=0)
    torch.manual_seed(11)
    tokens = decoder.generate(model, ids, mask)[:, 1:]  # the replayed step's draws (the first is the prefill's)
    assert tokens.numel() == 200_000
    with torch.no_grad():
        logits = model(input_ids=ids[:1], attention_mask=mask[:1]).logits[0, -1]
    probs = torch.softmax(processed_scores(logits, 0.7, 0.9, None), dim=-1).double()
    kept = probs > 0
    assert 5 <= int(kept.sum()) < probs.numel() - 10  # top_p dropped many tokens, several remain
    drawn = torch.bincount(tokens.flatten(), minlength=probs.numel()).double()
    assert drawn[~kept].sum() == 0  # never a truncated token
    generator = torch.Generator().manual_seed(12)
    reference = torch.bincount(torch.multinomial(probs.float(), 200_000, replacement=True, generator=generator),
                               minlength=probs.numel()).double()
    # goodness of fit against the processed distribution, and homogeneity with torch.multinomial's draws
    expected = probs[kept] * 200_000
    fit = float(((drawn[kept] - expected) ** 2 / expected).sum())
    assert _chi2_sf(fit, int(kept.sum()) - 1) > 1e-3, fit
    both = drawn[kept] + reference[kept]
    homogeneity = float((((drawn[kept] - both / 2) ** 2 + (reference[kept] - both / 2) ** 2) / (both / 2)).sum())
    assert _chi2_sf(homogeneity, int(kept.sum()) - 1) > 1e-3, homogeneity
    counts = decoder.summary()
    assert counts["replays"] == steps - 1 and counts["host_syncs"] <= 1 + math.ceil(steps / 64)


def test_greedy_tokens_equal_the_dynamic_caches_over_buckets_with_one_compile() -> None:
    model, greedy = _tiny_model()
    eos = model.generation_config.eos_token_id  # HF generate falls back to the model's EOS (2): a row stops there
    decoder = OwnedDecoder(model, [8, 16], 4, 6, _config(6, eos=eos, do_sample=False), compile_backend="aot_eager",
                           check_every=4)
    for lengths, seed in (([5, 3, 7, 6], 0), ([12, 9, 16, 10], 1), ([3, 3], 2)):
        ids, mask = _left_padded(lengths, seed)
        with torch.no_grad():
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(decoder.generate(model, ids, mask), plain)
    summary = decoder.summary()
    assert summary["compiles"] == 1 and summary["recordings"] == summary["compiles"] and summary["recompiles"] == 0
    assert summary["generate_calls"] == 3 and summary["replays"] == 3 * 5 and not summary["cuda_graph"]
    assert loop_counts_problem(summary) is None
    assert decode_counts_problem({"generation": {"decode_cache": "owned_loop", "decode_counts": summary}}) is None


def test_an_attention_window_reads_only_the_cache_positions_inside_it() -> None:
    """Keys and values past the window are NaN: inside attention_window they are never read (the output is the
    attention over the window's positions), outside it they poison the output."""
    from inner_loop.generation.gqa_attention import attention_window, gqa_decode_attention

    module = torch.nn.Module()
    module.num_key_value_groups = 2
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 1, 8, generator=gen)
    key, value = torch.randn(3, 2, 28, 8, generator=gen), torch.randn(3, 2, 28, 8, generator=gen)
    mask = torch.ones(3, 1, 1, 28, dtype=torch.bool)
    mask[:, :, :, 10:] = False  # the unfilled positions are masked, as the loop's keys mask does
    poisoned_key, poisoned_value = key.clone(), value.clone()
    poisoned_key[:, :, 14:], poisoned_value[:, :, 14:] = float("nan"), float("nan")
    with attention_window(14):
        windowed, _ = gqa_decode_attention(module, query, poisoned_key, poisoned_value, mask)
    whole, _ = gqa_decode_attention(module, query, key, value, mask)
    assert torch.allclose(windowed, whole, atol=1e-6)
    unwindowed, _ = gqa_decode_attention(module, query, poisoned_key, poisoned_value, mask)
    assert torch.isnan(unwindowed).any()


def test_attention_windows_give_the_whole_caches_tokens_with_one_compile_per_window() -> None:
    """train.decode_windows: the step compiled once per window, the host replays the smallest window holding the
    filled positions, and the tokens are the dynamic cache's."""
    model, greedy = _tiny_model()
    greedy = copy.deepcopy(greedy)
    greedy.max_new_tokens = 12
    eos = model.generation_config.eos_token_id
    decoder = OwnedDecoder(model, [8, 16], 4, 12, _config(12, eos=eos, do_sample=False), compile_backend="aot_eager",
                           check_every=4, windows=2)
    assert decoder.windows == [14, 28]  # 28 positions in 2 steps of 14
    for lengths, seed in (([5, 3, 7, 6], 0), ([12, 9, 16, 10], 1)):
        ids, mask = _left_padded(lengths, seed)
        with torch.no_grad():
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(decoder.generate(model, ids, mask), plain)
    summary = decoder.summary()
    assert summary["windows"] == [14, 28]
    assert summary["compiles"] == 2 and summary["recordings"] == 2  # one per window, none again
    assert loop_counts_problem(summary) is None
    used = summary["window_replays"]
    assert sum(used.values()) == summary["replays"] and used.get(14, 0) > 0  # bucket 8's first steps read 14 of 28
    assert used.get(28, 0) > 0  # bucket 16's last ones the whole cache


def test_the_loop_stops_at_eos_and_pads_after_it() -> None:
    model, _ = _tiny_model()
    ids, mask = _left_padded([5, 3, 7, 6], 0)
    with torch.no_grad():
        free = OwnedDecoder(model, [8], 4, 12, _config(12, do_sample=False), compile_backend="aot_eager")
        first = free.generate(model, ids, mask)
        eos = int(first[0, 2])  # the token row 0 takes third: an EOS there ends it, and pads follow
        stopping = OwnedDecoder(model, [8], 4, 12, _config(12, eos=eos, do_sample=False), compile_backend="aot_eager",
                                check_every=2)
        out = stopping.generate(model, ids, mask)
    for row in range(4):
        hits = (first[row] == eos).nonzero()
        end = int(hits[0]) + 1 if hits.numel() else out.size(1)
        assert torch.equal(out[row, :end], first[row, :end]) and (out[row, end:] == 0).all()
    if all((r == eos).any() for r in first):  # every row ended: the host stopped replaying at the next check
        assert out.size(1) < 12


def test_importance_ratio_against_the_training_forward_and_lora_merged_restored_exactly() -> None:
    model = _lora_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    decoder = OwnedDecoder(model, [8], 6, 10, _config(10, **SAMPLING), compile_backend="aot_eager")
    assert decoder.summary()["merged_lora_layers"] == 6  # q, v, down in two layers
    assert decoder.summary()["merged_bytes"] == sum(m.base_layer.weight.numel() * 4 for m in decoder.merged.layers)
    ids, mask = _left_padded([5, 3, 7, 6, 8, 2], seed=4)
    torch.manual_seed(5)
    tokens = decoder.generate(model, ids, mask)
    assert decoder.merged.merges == 1
    for key, value in model.state_dict().items():  # the trained weights and adapters are back, bit for bit
        assert torch.equal(value, before[key]), key
    with torch.no_grad():  # the training forward: the unmerged LoRA model over prompt + completion
        full = model(input_ids=torch.cat([ids, tokens], 1),
                     attention_mask=torch.cat([mask, torch.ones_like(tokens)], 1)).logits
    logits = full[:, ids.size(1) - 1:-1].float() / 0.7
    trained = processed_logps(logits, tokens, 0.9, None)
    ratio = torch.exp(trained - decoder.last_logps)
    assert ratio.numel() == 60 and ((ratio - 1).abs() <= 0.005).all(), ratio
    # and the merge matters: the base model alone gives other log-probs
    with torch.no_grad(), model.disable_adapter():
        base = model(input_ids=torch.cat([ids, tokens], 1),
                     attention_mask=torch.cat([mask, torch.ones_like(tokens)], 1)).logits
    base_logps = processed_logps(base[:, ids.size(1) - 1:-1].float() / 0.7, tokens, 0.9, None)
    assert (torch.exp(base_logps - decoder.last_logps) - 1).abs().max() > 0.05


def test_a_seed_reproduces_its_completions_and_another_does_not() -> None:
    model, _ = _tiny_model()
    decoder = OwnedDecoder(model, [8], 8, 12, _config(12, do_sample=True, temperature=1.0, top_p=1.0),
                           compile_backend="aot_eager")
    ids, mask = _left_padded([5, 3, 7, 6, 8, 2, 4, 4], seed=0)

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return decoder.generate(model, ids, mask)

    first = run(1)
    assert torch.equal(run(1), first)
    assert not torch.equal(run(2), first)


def test_no_host_sync_per_token_counted_by_patching_torchs_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a tensor's value reaches Python is counted while the loop decodes 40 tokens (its step compiled
    beforehand): the reads must be the bucket's one per call and one finished flag per ``check_every`` tokens."""
    model, _ = _tiny_model()
    steps, every = 40, 8
    decoder = OwnedDecoder(model, [8], 4, steps, _config(steps, **SAMPLING), compile_backend="aot_eager",
                           check_every=every)
    ids, mask = _left_padded([5, 3, 7, 6], seed=0)
    decoder.generate(model, ids, mask)  # compiles (dynamo reads values while tracing)
    reads = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    syncs = decoder.counts.host_syncs
    decoder.generate(model, ids, mask)
    monkeypatch.undo()
    assert decoder.counts.host_syncs - syncs == len(reads) == 1 + (steps - 1) // every, reads
    assert decoder.summary()["host_syncs_per_token"] <= 1 / every + 1 / steps


def test_persistent_merged_decodes_lora_merged_and_greedy_equals_unmerged() -> None:
    from inner_loop.generation.decode_step import PersistentDecoder

    model = _lora_model()
    greedy = _config(6, do_sample=False)
    ids, mask = _left_padded([5, 3, 7, 6], seed=0)
    merged = PersistentDecoder(model, [8], 4, 6, greedy, compile_backend="aot_eager", merge_lora=True)
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        assert torch.equal(merged.generate(model, ids, mask), plain)
    summary = merged.summary()
    assert merged.merged.merges == 1 and summary["merged_bytes"] > 0 and summary["weights_moved"] == 0


def test_owned_loop_settings_are_checked_up_front_naming_the_key() -> None:
    TrainConfig(decode_cache="owned_loop").validate()
    TrainConfig(decode_cache="persistent_merged").validate()
    with pytest.raises(ValueError, match=r"train.decode_cache=owned_loop .* train.trl.min_p=0.1"):
        TrainConfig(decode_cache="owned_loop", trl={"min_p": 0.1}).validate()
    with pytest.raises(ValueError, match=r"train.decode_cache='owned_loop' applies to HF generate only"):
        TrainConfig(decode_cache="owned_loop", trl={"use_vllm": True}).validate()
    model, _ = _tiny_model()
    with pytest.raises(ValueError, match=r"would not apply repetition_penalty=1.2"):
        OwnedDecoder(model, [8], 2, 4, _config(4, do_sample=True, repetition_penalty=1.2), compile_backend="eager")


def test_a_lora_member_trains_on_the_owned_loop_and_greedy_equals_the_dynamic_cache(tmp_path: Path) -> None:
    greedy = {"steps": 2, "save_every": 2, "trl": {"generation_kwargs": {"do_sample": False}}}
    records = {cache: _member(tmp_path, cache, _inner(cache, **greedy)) for cache in ("dynamic", "owned_loop")}
    assert all(r.status == "ok" for r in records.values()), {c: r.error for c, r in records.items()}
    counts = records["owned_loop"].generation["decode_counts"]
    assert counts["generate_calls"] == 2 and counts["merged_lora_layers"] > 0
    assert decode_counts_problem({"generation": records["owned_loop"].generation}) is None
    assert (records["owned_loop"].generation["completions_sha256"]
            == records["dynamic"].generation["completions_sha256"])


def test_the_windows_are_even_steps_up_to_the_whole_cache_and_out_of_range_is_refused() -> None:
    from inner_loop.generation.owned_loop import attention_windows

    assert attention_windows(28, 1) == [28]
    assert attention_windows(28, 4) == [7, 14, 21, 28]
    assert attention_windows(10, 8) == [2, 4, 6, 8, 10]  # a step of 2: fewer windows than asked, never past the cache
    for bad in (0, 9):
        with pytest.raises(ValueError, match="train.decode_windows"):
            attention_windows(28, bad)
    with pytest.raises(ValueError, match="train.decode_windows=2 applies to train.decode_cache=owned_loop"):
        TrainConfig(decode_windows=2).validate()


def test_decoders_built_one_after_another_in_a_process_are_not_refused_by_dynamos_limit() -> None:
    """Every decoder compiles the one ``_step`` code once per window its shapes have not been compiled for, and the
    entries of decoders built before stay in that code's cache: with dynamo's limit at 1, a second decoder with a
    new window (10 of 20 positions) still compiles, where dynamo would refuse it."""
    model, greedy = _tiny_model()
    greedy = copy.deepcopy(greedy)
    greedy.max_new_tokens = 12
    ids, mask = _left_padded([5, 3, 7, 6], 0)
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
    eos = model.generation_config.eos_token_id
    with torch._dynamo.config.patch(recompile_limit=1):
        for windows in (1, 2):
            decoder = OwnedDecoder(model, [8], 4, 12, _config(12, eos=eos, do_sample=False),
                                   compile_backend="aot_eager", windows=windows)
            assert torch.equal(decoder.generate(model, ids, mask), plain)
    assert decoder.windows == [10, 20] and decoder.summary()["compiles"] >= 1
