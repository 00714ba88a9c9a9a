"""Run by tests/test_inner_loop/generation/test_vllm_member.py in a process of its own (vLLM's engine seeds the process's
RNGs and replaces torch.set_num_threads): does a weight push through ``push_weights_by_reload`` change what vLLM
generates, exactly?

Prints one JSON line: greedy completions before, after pushing perturbed weights, and after pushing the originals
back; and the largest |vLLM log-prob - HF log-prob| of the perturbed model on the tokens vLLM chose after the push.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


class _Generation:
    """The two things of TRL's VLLMGeneration the push reads: its engine and its (name, tensor) iterator."""

    def __init__(self, llm, named):
        self.llm, self._named = llm, named

    def _iter_named_params(self):
        yield from self._named


def main(model_dir: str) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from inner_loop.generation.vllm_colocate import (claim_rendezvous_port, push_weights_by_reload,
                                                      set_cpu_cache_from_allocation)

    claim_rendezvous_port()
    # as a member does: a KV cache of its own size (without one, vLLM's CPU worker reserves 92% of the node's memory
    # and refuses to start when less than that is free)
    set_cpu_cache_from_allocation()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher")  # in this process, as TRL's colocate mode does
    prompts = ["12+34=", "07+55=", "90+09="]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)

    def generate():
        return [(out.prompt_token_ids, out.outputs[0]) for out in llm.generate(prompts, greedy, use_tqdm=False)]

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    original = [(name, p.detach().clone()) for name, p in policy.named_parameters()]
    before = generate()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a policy far from the checkpoint: every weight moved by noise of std 0.5
        for p in policy.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=generator))
    push_weights_by_reload(_Generation(llm, [(n, p.detach()) for n, p in policy.named_parameters()]), is_peft=False)
    after = generate()
    worst = 0.0
    for prompt_ids, completion in after:
        ids = torch.tensor([prompt_ids + list(completion.token_ids)])
        with torch.no_grad():
            logps = torch.log_softmax(policy(ids).logits[0, len(prompt_ids) - 1:-1], dim=-1)
        for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            worst = max(worst, abs(float(logps[step, token]) - entry[token].logprob))
    push_weights_by_reload(_Generation(llm, original), is_peft=False)
    restored = generate()
    texts = {name: [c.text for _, c in outs] for name, outs in (("before", before), ("after", after),
                                                                  ("restored", restored))}
    print(json.dumps({**texts, "max_logprob_error_after_push": worst}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main(sys.argv[1])
