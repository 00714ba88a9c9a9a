"""The persistent compiled decode step as a member runs it on a card: compiled once, recorded once, replayed.

Why: on CUDA the decode step runs under ``mode="reduce-overhead"`` (CUDA graphs), and what makes it pay or not is
invisible on a CPU: a graph inductor skips (each kernel launched one by one), a recording at every generation (a
weight or cache address that moved, a guard that fails after the optimizer step or after gradient checkpointing
was switched back on), a graph break. So a two-layer model shaped like Qwen3 (q/k norms, grouped-query heads) with
LoRA goes through what a member does between generations, three times: generate over the persistent cache with
checkpointing off (as TRL generates), checkpointing on, a training step with AdamW updating the adapter in place.
Then: recordings == compiles, no skip, no recompile, one graph, no copy of the cache per query head in the graph
inductor generated from, and greedy tokens equal to the dynamic cache's (the eager model's). Skipped without CUDA;
where there is none the same sequence runs on the CPU with inductor's default mode (no CUDA graphs there: the
counts, the graph and the tokens).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from inner_loop.generation.decode_step import PersistentDecoder, decode_counts_problem, input_grad_hooks
from test_decode_step import expanded_cache

#: Prompt lengths of the three generations (buckets 16 and 32: the second generation uses the other one)
GENERATIONS = ([5, 9, 14, 16], [20, 3, 31, 12], [7, 7, 2, 11])
#: Top-two logit gaps below this along the eager path are near-ties, where compiled and eager kernels' rounding may
#: pick either token: the comparison stops there in that row
NEAR_TIE = 1e-3


def _lora_qwen3(device: str) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    model = Qwen3ForCausalLM(config).to(device)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                "o_proj"]))
    model.enable_input_require_grads()  # as TRL does for a PEFT model with gradient checkpointing
    return model.train()  # TRL generates with the policy in training mode


def _prompts(lengths: list[int], seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, -n:] = torch.randint(1, 512, (n,), generator=generator)
        mask[row, -n:] = 1
    return ids.to(device), mask.to(device)


def _agreeing(ours: torch.Tensor, plain: torch.Tensor, scores: tuple[torch.Tensor, ...]) -> tuple[int, int]:
    """(tokens compared, tokens equal): each row up to its first near-tie on the eager path."""
    top = torch.stack([s.float().topk(2).values for s in scores], dim=1)  # rows x steps x 2
    tied = (top[..., 0] - top[..., 1]) < NEAR_TIE
    compared = equal = 0
    for row in range(plain.size(0)):
        upto = int(tied[row].int().argmax()) if bool(tied[row].any()) else plain.size(1)
        compared += upto
        equal += int((ours[row, :upto] == plain[row, :upto]).sum())
    return compared, equal


def _three_generations(device: str) -> tuple[dict[str, Any], int, int, int, int]:
    """The member's sequence three times; returns the decoder's summary, the graphs dynamo made and the graph breaks
    it met meanwhile, and the greedy tokens compared and found equal. Inductor's post-grad graph of the decode step
    (what it generates kernels from, on this device) is checked for the cache expanded to every query head."""
    from torch._dynamo.utils import counters
    from transformers import GenerationConfig

    post_grad: list[tuple[str, tuple[int, ...]]] = []

    def record(graph: torch.fx.Graph) -> None:  # a plain callable: inductor's FX cache is bypassed, the pass runs
        post_grad.extend((str(n.target), tuple(n.meta["val"].shape)) for n in graph.nodes
                         if isinstance(n.meta.get("val"), torch.Tensor))

    model = _lora_qwen3(device)
    greedy = GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    decoder = PersistentDecoder(model, [16, 32], batch_size=4, max_new_tokens=8, generation_config=greedy,
                                compile_backend="inductor")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    compared = equal = 0
    for seed, lengths in enumerate(GENERATIONS):
        ids, mask = _prompts(lengths, seed, device)
        model.gradient_checkpointing_disable()  # as TRL's unwrap_model_for_generation
        with torch.no_grad(), torch._inductor.config.patch(post_grad_custom_post_pass=record):
            ours = decoder.generate(model, ids, mask)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy, output_scores=True,
                                 return_dict_in_generate=True)
        seen, same = _agreeing(ours, out.sequences[:, ids.size(1):], out.scores)
        compared, equal = compared + seen, equal + same
        # checkpointing back on (a new input-grad hook each time, as TRL re-enables it), then an in-place step
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        full = torch.cat([ids, ours], dim=1)
        model(input_ids=full, labels=full).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert input_grad_hooks(model), "the input-grad hooks were not put back after decoding"
    config = model.config
    assert post_grad, "inductor's post-grad pass never saw the decode step"
    assert expanded_cache(post_grad, decoder.batch_size, config.num_attention_heads, decoder.max_cache_len,
                          config.head_dim) == []
    summary = decoder.summary()
    return (summary, counters["stats"]["unique_graphs"] - graphs,
            sum(counters["graph_break"].values()) - breaks, compared, equal)


def _common(summary: dict[str, Any], graphs: int, breaks: int, compared: int, equal: int) -> None:
    assert summary["generate_calls"] == 3 and summary["buckets_used"] == {"16": 2, "32": 1}
    assert summary["compiles"] == 1 and summary["recompiles"] == 0, summary
    assert graphs == 1 and breaks == 0
    assert summary["weights_moved"] == 0 and summary["cache_kept"]
    total = 3 * 4 * 8
    assert compared >= total // 2, f"only {compared} of {total} tokens outside near-ties"
    assert equal == compared, f"{compared - equal} of {compared} greedy tokens differ from the dynamic cache's"
    assert decode_counts_problem({"generation": {"decode_cache": "persistent_compiled",
                                                 "decode_counts": summary}}) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
def test_on_a_card_the_decode_step_is_recorded_once_and_replayed_across_training_steps() -> None:
    summary, *rest = _three_generations("cuda")
    assert summary["compile_mode"] == "reduce-overhead"
    assert summary["cudagraph_skips"] == 0, "inductor left the decode step without a CUDA graph (TORCH_LOGS=cudagraphs)"
    assert summary["cudagraph_recordings"] == summary["compiles"], summary
    _common(summary, *rest)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the same sequence runs on the card (the CUDA test), whose "
                    "minutes the GPU pass counts")
def test_on_the_cpu_inductor_compiles_the_decode_step_once_across_training_steps() -> None:
    summary, *rest = _three_generations("cpu")
    assert summary["compile_mode"] == "default" and summary["cudagraph_recordings"] is None
    _common(summary, *rest)
