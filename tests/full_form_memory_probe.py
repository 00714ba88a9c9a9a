"""What a user's run holds: a few GBMPO training steps (generation, loss, backward with the gradient-share diagnostics,
optimizer) of a tiny-width Qwen3 at its full 151,936-token vocabulary, with LoRA as mbpp_qwen3 trains, in this
process; prints the process's resident peak (VmHWM) over those steps as JSON. Run in a fresh process per form and
shape by tests/test_inner_loop/loss/test_full_form_memory.py and bench/bench_full_form.py, which compare the full form's peak
with the sampled form's.

    python tests/full_form_memory_probe.py --form full --shapes 2x16:2,4x64:1   # one JSON line per shape
    python tests/full_form_memory_probe.py --form full --no-diagnostics      # the divergence alone

Each shape's peak counts from the moment its trainer is built (VmHWM reset through /proc/self/clear_refs, after the
previous shape's memory went back to the kernel), so the imports and the model's construction, which both forms
share, do not hide a step's peak."""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench.bench_full_form import VOCAB, diagnostics_off, logits_bytes  # noqa: E402
from inner_loop.member.entry import keep_vllm_out_unless_used  # noqa: E402

PROMPT = "1+1="


def resident() -> tuple[int, int]:
    """(VmHWM, VmRSS) of this process in bytes."""
    status = Path("/proc/self/status").read_text()
    return (int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024,
            int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024)


def build_trainer(form: str, rows: int, tokens: int, steps: int, out: Path):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig

    from inner_loop.config import DivergenceConfig
    from inner_loop.grpo.trainer import MirrorGRPOTrainer
    from inner_loop.loss.regularizers import build_regularizer
    from inner_loop.models.tiny import build_tiny_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(
        r=8, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]))
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=rows, num_generations=rows,
                      max_completion_length=tokens, beta=0.0, loss_type="dr_grpo", report_to=[], use_cpu=True,
                      temperature=0.8, max_steps=steps, bf16=False, save_strategy="no", logging_steps=1,
                      learning_rate=1e-3)
    rewards = torch.Generator().manual_seed(1)

    def reward(completions, **_):  # random rewards: advantages that move the policy
        return torch.rand(len(completions), generator=rewards).tolist()

    trainer = MirrorGRPOTrainer(model=model, reward_funcs=reward, args=args,
                                train_dataset=Dataset.from_dict({"prompt": [PROMPT] * rows * steps}),
                                processing_class=build_tiny_tokenizer(),
                                regularizer=build_regularizer(DivergenceConfig(name="neural_mirror", form=form,
                                                                               coef=1.0)))
    with torch.no_grad():  # the adapter away from zero: the policy is not its reference from the first step
        for name, param in trainer.model.named_parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    return trainer


def release() -> None:
    """Hand the memory freed since the last call back to the kernel, so that the next shape's peak starts from what
    is live (glibc keeps freed heap pages resident)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the next peak may then include pages the previous shape freed
        pass


def measure(form: str, rows: int, tokens: int, steps: int, exact_share_step: int, diagnostics: bool) -> dict:
    """One training run of ``steps`` steps at ``rows`` x ``tokens``; the exact gradient share is measured at step
    ``exact_share_step`` (the trainer's own is 1: 0 puts it in a one-step run); neither share without
    ``diagnostics``."""
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(form, rows, tokens, steps, Path(out))
        trainer._exact_share_step = exact_share_step
        release()
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts from what is resident now
        before = resident()[1]
        began = time.perf_counter()
        with diagnostics_off(trainer) if not diagnostics else contextlib.nullcontext():
            trainer.train()
        seconds = time.perf_counter() - began
        peak = resident()[0]
        history = [entry for entry in trainer.state.log_history if "loss" in entry]
        del trainer
    release()
    return {"form": form, "rows": rows, "tokens": tokens, "steps": len(history), "before": before, "peak": peak,
            "logits_bytes": logits_bytes(rows, tokens), "seconds": seconds,
            "grad_share_exact": [e.get("regularizer/grad_share_exact") for e in history]}


def shape(text: str) -> tuple[int, int, int]:
    """ROWSxTOKENS[:STEPS] -> (rows, tokens, steps); one step unless given."""
    size, _, steps = text.partition(":")
    rows, tokens = size.split("x")
    return int(rows), int(tokens), int(steps or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=("sampled", "full"), required=True)
    parser.add_argument("--shapes", type=lambda text: [shape(item) for item in text.split(",")],
                        default=[(2, 16, 2), (4, 64, 1)],
                        help="ROWSxTOKENS[:STEPS],...: completions per step (one group), their length, optimizer steps; "
                             "measured one after the other in this process")
    parser.add_argument("--exact-share-step", type=int, default=0,
                        help="the step whose batch also takes the exact gradient share (two more backward passes)")
    parser.add_argument("--no-diagnostics", action="store_true", help="without the gradient-share diagnostics")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    keep_vllm_out_unless_used({})  # its trainer never generates with vLLM, which TRL would import (both forms alike)
    torch.set_num_threads(opts.threads)
    for rows, tokens, steps in opts.shapes:
        measured = measure(opts.form, rows, tokens, steps, opts.exact_share_step, not opts.no_diagnostics)
        print(json.dumps({**measured, "diagnostics": not opts.no_diagnostics}), flush=True)


if __name__ == "__main__":
    main()
