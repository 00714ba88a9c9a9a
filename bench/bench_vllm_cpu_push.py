"""vLLM on CPU: what keeping the packed kernels costs or saves against the plain F.linear path the first CPU
colocate trial used (issue "Fast generation": "measure what the unpacked path costs").

Two ways to make TRL's weight push work on vLLM's CPU platform:
- packed (what members do, inner_loop/generation/vllm_colocate.py): vLLM keeps its oneDNN / sgl packed weights, and
  a push goes through vLLM's in-place reload (restore, load, repack; tied layers re-tied);
- unpacked: vLLM's packing step replaced by one that keeps the plain weight and calls torch's F.linear, so TRL's own
  per-parameter ``load_weights`` push works as on a GPU.
Each arm runs in a process of its own (the engine is per process), alternated A B A B; each measures, on SmolLM2-135M
in float32 (the policy's dtype), the warm generation rate (greedy, fixed length) and the time of one weight push.

    .venv/bin/python bench/bench_vllm_cpu_push.py --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ARMS = ("packed", "unpacked")
PROMPTS = ["Write a Python function that returns the sum of a list.", "Write a Python function that reverses a string.",
           "Write a Python function that checks whether a number is prime.", "Write a function to sort a list."]


class _Generation:
    """What the reload push reads of TRL's VLLMGeneration: its engine and its (name, tensor) iterator."""

    def __init__(self, llm, named):
        self.llm, self._named = llm, named

    def _iter_named_params(self):
        yield from self._named


def arm(name: str, samples: int, tokens: int) -> dict:
    """One arm in this process: build the engine, time warm generation and one push."""
    import torch

    from inner_loop.config import ModelConfig
    from inner_loop.generation.vllm_colocate import claim_rendezvous_port, push_weights_by_reload
    from inner_loop.models.smollm2 import smollm2_model_dir

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
        os.environ.setdefault(key, value)
    claim_rendezvous_port()
    model_dir = str(smollm2_model_dir(ModelConfig(name="smollm2_135m")))
    if name == "unpacked":
        import vllm.model_executor.layers.utils as vllm_layer_utils

        def keep_plain_weight(layer, remove_weight):  # noqa: ARG001 - vLLM's signature
            layer.cpu_linear = torch.nn.functional.linear

        vllm_layer_utils.dispatch_cpu_unquantized_gemm = keep_plain_weight
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher")
    build_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, n=1)
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(samples)]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: kernel set-up, first allocations
    started = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    generate_s = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = [(n, p.detach()) for n, p in policy.named_parameters()]
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    started = time.perf_counter()
    if name == "packed":
        push_weights_by_reload(_Generation(llm, named), is_peft=False)
    else:  # TRL's own colocate push
        for param_name, tensor in named:
            runner.model.load_weights([(param_name, tensor)])
        llm.reset_prefix_cache()
    push_s = time.perf_counter() - started
    return {"arm": name, "engine_build_s": build_s, "tokens": generated, "generate_s": generate_s,
            "tokens_per_s": generated / generate_s, "push_s": push_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs, alternated")
    parser.add_argument("--samples", type=int, default=16, help="completions per timed generate call")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per completion (greedy, eos ignored)")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.arm:
        print(json.dumps(arm(opts.arm, opts.samples, opts.tokens)))
        return
    results: dict[str, list[dict]] = {a: [] for a in ARMS}
    for _ in range(opts.rounds):
        for name in ARMS:
            done = subprocess.run([sys.executable, __file__, "--arm", name, "--samples", str(opts.samples),
                                   "--tokens", str(opts.tokens)], capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                raise SystemExit(f"arm {name} failed:\n{done.stderr[-3000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"SmolLM2-135M float32, {opts.samples} completions x {opts.tokens} tokens per call, {opts.rounds} rounds "
          "(median; per-round values in brackets)")
    print(f"{'arm':10s} {'engine s':>9s} {'tokens/s':>9s} {'push s':>8s} {'tokens/s vs packed':>19s}")
    base = statistics.median(r["tokens_per_s"] for r in results["packed"])
    for name in ARMS:
        rows = results[name]
        rate = statistics.median(r["tokens_per_s"] for r in rows)
        per_round = ", ".join(f"{r['tokens_per_s']:.0f}" for r in rows)
        print(f"{name:10s} {statistics.median(r['engine_build_s'] for r in rows):9.1f} {rate:9.1f} "
              f"{statistics.median(r['push_s'] for r in rows):8.2f} {rate / base:18.2f}x  "
              f"[{per_round}]")


if __name__ == "__main__":
    main()
