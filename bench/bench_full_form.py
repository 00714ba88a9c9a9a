"""The full divergence form's training step against the sampled form's and exact full-vocabulary KL's, side by side.

A step is what training runs for one batch: MirrorGRPOTrainer._compute_loss and its backward, LoRA on a Qwen3 at its
151,936-token vocabulary, the policy away from its reference, the per-step gradient share on. Variants, timed call by
call in turn in one process, medians of --repeats:

- ``sampled``: the neural map in the sampled form (TRL's fused log-probs, the sampled token's divergence);
- ``full``: the neural map in the full form (mirror_maps.tiled: hidden states through the LM heads, in tiles);
- ``full_no_diagnostics``: the same without the per-step gradient share's norms: the divergence's own cost;
- ``kl_full``: KL in the full form, the exact full-vocabulary KL through the same tiles.

Beside each step time: the exact gradient share's extra time (two more backward passes, once per run), and its peak
memory. On CUDA: max_memory_allocated above the step's start, per variant in this process (the step, then the step
with the exact share). On the CPU, with --memory: the process peak over whole training steps in a fresh process per
form (tests/full_form_memory_probe.py, the memory test's probe) beyond the sampled form's, in multiples of the batch's
float32 logits.

    python bench/bench_full_form.py                                  # CPU, tiny widths, 4 x 64 tokens
    python bench/bench_full_form.py --memory                         # ... and the process peaks
    python bench/bench_full_form.py --device cuda --shape mbpp_qwen3 # Qwen3-1.7B, LoRA r=64, 64 x 256, bf16
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout that is not pip-installed
# torch is imported where it is used: scripts/gpu_pass.py reads this module's check before it imports torch

logger = logging.getLogger("bench_full_form")

VOCAB = 151_936
#: variant -> (divergence, form, per-step diagnostics)
VARIANTS = {"sampled": ("neural_mirror", "sampled", True), "full": ("neural_mirror", "full", True),
            "full_no_diagnostics": ("neural_mirror", "full", False), "kl_full": ("kl", "full", True)}
#: --shape: the architecture keys over Qwen3-1.7B's and the batch; tiny: the memory test's widths and large shape;
#: mbpp_qwen3: the preset's model (LoRA r=64, bf16 on CUDA), 64 completions of 256 tokens (its batch), 128 prompt tokens
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"overrides": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8},
             "rows": 4, "tokens": 64, "prompt": 16, "lora_r": 8},
    "mbpp_qwen3": {"overrides": {}, "rows": 64, "tokens": 256, "prompt": 128, "lora_r": 64},
}
#: scripts/gpu_pass.py's ``full_form`` check: the minutes it needs (an estimate: the model built on the card, ~1 min; a
#: full-form step of 16,384 positions a few seconds per call) and its arguments on the CPU (the pass's plumbing)
GPU_PASS_MINUTES = 3.0
GPU_PASS_CPU_ARGS = ["--shape", "tiny", "--rows", "2", "--tokens", "8", "--repeats", "1", "--threads", "1"]
#: the pass stops the check at this many times its minutes
GPU_PASS_LIMIT_MARGIN = 1.3


def logits_bytes(rows: int, tokens: int) -> int:
    """The batch's float32 logits at Qwen3's vocabulary: the unit memory is stated in."""
    return rows * tokens * VOCAB * 4


@contextmanager
def diagnostics_off(trainer: Any) -> Iterator[None]:
    """The full form without the gradient share (per step and exact): what the divergence itself costs."""
    full_form = trainer._full_form
    trainer._full_form = lambda *args, with_norms: full_form(*args, with_norms=False)
    trainer._log_grad_share = lambda *args: None
    try:
        yield
    finally:
        del trainer._full_form, trainer._log_grad_share


def build(opts: argparse.Namespace, device: torch.device) -> tuple[Any, dict[str, Any], dict[str, torch.Tensor]]:
    """(trainer, regularizer by variant, batch): one LoRA model and trainer; the variants swap its regularizer (with
    LoRA the reference is the base with the adapter disabled, the same module for every variant)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import GRPOConfig

    from inner_loop.config import DivergenceConfig, ModelConfig
    from inner_loop.grpo.trainer import MirrorGRPOTrainer
    from inner_loop.loss.regularizers import build_regularizer
    from inner_loop.models.from_config import architecture_config, build_random_model
    from inner_loop.models.tiny import build_tiny_tokenizer

    shape = SHAPES[opts.shape]
    tokenizer = build_tiny_tokenizer()
    model = build_random_model(architecture_config("qwen3_1_7b", shape["overrides"]), tokenizer, seed=0,
                               device=str(device))
    cuda = device.type == "cuda"
    model = model.to(torch.bfloat16 if cuda else torch.float32)
    model = get_peft_model(model, LoraConfig(r=shape["lora_r"], lora_alpha=shape["lora_r"], lora_dropout=0.0,
                                             target_modules=list(ModelConfig().lora_target_modules)))
    args = GRPOConfig(output_dir=str(opts.work), per_device_train_batch_size=opts.rows, num_generations=opts.rows,
                      max_completion_length=opts.tokens, beta=0.0, loss_type="dr_grpo", report_to=[],
                      use_cpu=not cuda, bf16=cuda, temperature=0.8, max_steps=1)
    regularizers = {name: build_regularizer(DivergenceConfig(name=divergence, form=form, coef=1.0))
                    for name, (divergence, form, _) in VARIANTS.items()}
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                                train_dataset=Dataset.from_dict({"prompt": ["1+1="] * opts.rows}),
                                processing_class=tokenizer, regularizer=regularizers["full"])
    for regularizer in regularizers.values():
        if isinstance(regularizer.potential, torch.nn.Module):
            regularizer.potential.to(device)
    trainer.model.train()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the adapter away from zero: the policy is not its reference
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(0.02 * torch.randn(param.shape, generator=generator).to(param))
    prompt = torch.randint(0, VOCAB, (opts.rows, opts.prompt), generator=generator)
    completion = torch.randint(0, VOCAB, (opts.rows, opts.tokens), generator=generator)
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
             "completion_mask": torch.ones_like(completion),
             "advantages": torch.randn(opts.rows, generator=generator)}
    return trainer, regularizers, {key: value.to(device) for key, value in batch.items()}


def step(trainer: Any, regularizer: Any, batch: dict[str, torch.Tensor], diagnostics: bool, exact: bool) -> float:
    """Seconds of one loss + backward with ``regularizer``; ``exact``: with the exact gradient share too."""
    import torch

    trainer.regularizer = regularizer
    trainer._exact_share_step = 0 if exact else None
    trainer.model.zero_grad(set_to_none=True)
    device = batch["completion_ids"].device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    if diagnostics:
        trainer._compute_loss(trainer.model, batch).backward()
    else:
        with diagnostics_off(trainer):
            trainer._compute_loss(trainer.model, batch).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def peak_cuda_bytes(run: Any, device: torch.device) -> int:
    """Bytes allocated above what was allocated before ``run()``, at its peak."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def measure(opts: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = torch.device(opts.device)
    trainer, regularizers, batch = build(opts, device)
    variants = [name for name in VARIANTS if name in opts.variants]
    for name in variants:  # once first: what a first call sets up is not a step's
        step(trainer, regularizers[name], batch, VARIANTS[name][2], exact=False)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(opts.repeats):
        for name in variants:
            times[name].append(step(trainer, regularizers[name], batch, VARIANTS[name][2], exact=False))
    figures: dict[str, dict[str, Any]] = {}
    for name in variants:
        diagnostics = VARIANTS[name][2]
        row: dict[str, Any] = {"step_s": statistics.median(times[name]), "steps_s": times[name]}
        if diagnostics:  # the exact share's extra: one step with it, less the median step
            row["exact_share_s"] = step(trainer, regularizers[name], batch, True, exact=True) - row["step_s"]
        if device.type == "cuda":
            reg = regularizers[name]
            row["peak_bytes"] = peak_cuda_bytes(lambda: step(trainer, reg, batch, diagnostics, False), device)
            if diagnostics:
                row["peak_exact_bytes"] = peak_cuda_bytes(lambda: step(trainer, reg, batch, True, True), device)
        figures[name] = row
    return {"device": str(device), "card": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "shape": opts.shape, "rows": opts.rows, "tokens": opts.tokens, "prompt": opts.prompt,
            "threads": torch.get_num_threads(), "logits_bytes": logits_bytes(opts.rows, opts.tokens),
            "variants": figures}


def process_peaks(opts: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The memory test's probe (whole training steps, process peak), a fresh process per form, at this batch."""
    out = {}
    for name, extra in (("sampled", ["--form", "sampled"]), ("full", ["--form", "full"]),
                        ("full_no_diagnostics", ["--form", "full", "--no-diagnostics"])):
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "full_form_memory_probe.py"), *extra,
                               "--shapes", f"{opts.rows}x{opts.tokens}:1", "--exact-share-step", "0",
                               "--threads", str(opts.threads)], cwd=ROOT, capture_output=True, text=True, check=True)
        out[name] = json.loads([line for line in done.stdout.splitlines() if line.startswith('{"form"')][-1])
    return out


def report(result: dict[str, Any], peaks: dict[str, dict[str, Any]] | None) -> None:
    variants, logits = result["variants"], result["logits_bytes"]
    print(f"{result['device']} {result['card'] or ''} shape {result['shape']}: {result['rows']} x {result['tokens']} "
          f"completion tokens (+{result['prompt']} prompt), V = {VOCAB:,}, {result['threads']} thread(s); "
          f"float32 logits {logits / 2**20:.1f} MiB")
    print(f"{'variant':<22}{'step s':>10}{'exact share s':>15}{'peak / logits':>15}{'peak w/ exact':>15}")
    for name, row in variants.items():
        exact = f"{row['exact_share_s']:.3f}" if "exact_share_s" in row else "-"
        peak = f"{row['peak_bytes'] / logits:.2f}x" if "peak_bytes" in row else "-"
        peak_exact = f"{row['peak_exact_bytes'] / logits:.2f}x" if "peak_exact_bytes" in row else "-"
        print(f"{name:<22}{row['step_s']:>10.3f}{exact:>15}{peak:>15}{peak_exact:>15}")
    for name, base in (("full", "sampled"), ("full", "kl_full"), ("full", "full_no_diagnostics"),
                       ("kl_full", "sampled")):
        if name in variants and base in variants:
            print(f"time {name} / {base}: {variants[name]['step_s'] / variants[base]['step_s']:.2f}x")
    if peaks:
        sampled = peaks["sampled"]["peak"]
        for name, measured in peaks.items():
            print(f"process peak over a training step, {name}: {(measured['peak'] - measured['before']) / 2**20:.0f} "
                  f"MiB above its start; beyond the sampled form's: {(measured['peak'] - sampled) / logits:+.2f}x "
                  "the logits")


def gpu_pass_check(ctx: Any, gpu_pass: Any) -> dict[str, Any]:
    """scripts/gpu_pass.py's ``full_form`` check (``gpu_pass``: that script's module, for its runner and outcomes):
    this bench at mbpp_qwen3's shape on the card (small shapes on the CPU, the pass's plumbing), figures kept."""
    out = ctx.work / "full_form.json"
    shape = ["--shape", "mbpp_qwen3", "--repeats", "2"] if ctx.device == "cuda" else GPU_PASS_CPU_ARGS
    result = gpu_pass.run_command(ctx, [sys.executable, str(Path(__file__).resolve()), "--device", ctx.device,
                                        *shape, "--json", str(out)], ctx.work / "full_form.log",
                                  most_min=GPU_PASS_MINUTES * GPU_PASS_LIMIT_MARGIN)
    if result.returncode != 0 or not out.is_file():
        return {"status": gpu_pass.FAILED, "figures": {}, "detail": "\n".join(result.stdout.splitlines()[-20:])}
    figures = json.loads(out.read_text())
    full, sampled = figures["variants"]["full"], figures["variants"]["sampled"]
    logits = figures["logits_bytes"]
    detail = (f"{figures['rows']} x {figures['tokens']} tokens: full form {full['step_s']:.2f} s/step "
              f"({full['step_s'] / sampled['step_s']:.2f}x the sampled form's)")
    if "peak_bytes" in full:
        detail += (f", peak allocated {full['peak_bytes'] / 2**30:.2f} GiB = {full['peak_bytes'] / logits:.2f}x the "
                   f"float32 logits ({full['peak_exact_bytes'] / logits:.2f}x with the exact share; sampled "
                   f"{sampled['peak_bytes'] / logits:.2f}x)")
    return {"status": gpu_pass.PASSED, "figures": figures, "detail": detail}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rows", type=int, default=None, help="completions in the batch (default: the shape's)")
    parser.add_argument("--tokens", type=int, default=None, help="completion length (default: the shape's)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt length (default: the shape's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", type=lambda text: text.split(","), default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--memory", action="store_true", help="CPU: the process peaks of whole training steps too")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_full_form"), help="the trainer's output_dir")
    opts = parser.parse_args(argv)
    import torch

    for key in ("rows", "tokens", "prompt"):
        if getattr(opts, key) is None:
            setattr(opts, key, SHAPES[opts.shape][key])
    unknown = sorted(set(opts.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: {unknown} are not among {list(VARIANTS)}")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    opts.threads = torch.get_num_threads()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = measure(opts)
    peaks = process_peaks(opts) if opts.memory and opts.device == "cpu" else None
    if peaks:
        result["process_peaks"] = peaks
    report(result, peaks)
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
