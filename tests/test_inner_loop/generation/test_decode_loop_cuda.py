"""train.decode_cache=owned_loop on a card: the step compiled by inductor once, captured as one CUDA graph, replayed.

Why: what the CPU tests cannot see is the capture itself: a step that syncs inside (a graph that cannot be captured),
a draw whose noise repeats at every replay (the generator's offset not advanced), an address that moved between
generations (captured again). So a LoRA Qwen3-shaped model decodes three generations over two buckets: one compile,
one capture, greedy tokens equal to the dynamic cache's where the eager path has no near-tie, sampled rows that differ
from one replay to the next, and the importance ratio of the loop's processed log-probs against the training
forward's within 1 +- 0.005 (fp32). Skipped without CUDA.
"""
from __future__ import annotations

import pytest
import torch

from inner_loop.generation.decode_step import loop_counts_problem
from inner_loop.generation.owned_loop import OwnedDecoder
from inner_loop.generation.sampling import processed_logps
from test_decode_loop import _config
from test_decode_step_cuda import _lora_qwen3, _prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_owned_loop_is_captured_once_and_replayed_on_the_card() -> None:
    model = _lora_qwen3("cuda").eval()
    greedy = _config(12, eos=None, do_sample=False)
    decoder = OwnedDecoder(model, [16, 32], 4, 12, greedy, compile_backend="inductor", check_every=4)
    for lengths, seed in (([5, 9, 14, 16], 0), ([20, 3, 31, 12], 1), ([7, 7, 2, 11], 2)):
        ids, mask = _prompts(lengths, seed, "cuda")
        with torch.no_grad():
            plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)[:, ids.size(1):]
        ours = decoder.generate(model, ids, mask)
        assert (ours[:, :2] == plain[:, :2]).float().mean() >= 0.75  # the first tokens, before any near-tie
    summary = decoder.summary()
    assert summary["cuda_graph"] and summary["compiles"] == 1 and summary["recordings"] == 1
    assert loop_counts_problem(summary) is None


def test_sampled_on_the_card_the_ratio_to_the_training_forward_is_one() -> None:
    model = _lora_qwen3("cuda").eval()
    decoder = OwnedDecoder(model, [16], 8, 16, _config(16, do_sample=True, temperature=0.7, top_p=0.9),
                           compile_backend="inductor")
    ids, mask = _prompts([5, 9, 14, 16, 3, 8, 12, 10], 0, "cuda")
    torch.manual_seed(0)
    tokens = decoder.generate(model, ids, mask)
    assert len({tuple(r) for r in tokens[:, 1:].tolist()}) > 1  # fresh noise at every replay
    with torch.no_grad():
        full = model(input_ids=torch.cat([ids, tokens], 1),
                     attention_mask=torch.cat([mask, torch.ones_like(tokens)], 1)).logits
    trained = processed_logps(full[:, ids.size(1) - 1:-1].float() / 0.7, tokens, 0.9, None)
    ratio = torch.exp(trained - decoder.last_logps)
    assert ((ratio - 1).abs() <= 0.005).float().mean() >= 0.99, ratio
