"""Chunk-size sweep on a CUDA device: the measurements behind the CUDA chunk constants in mirror_maps.

(a) fused sampled form (mirror_maps.fused.CUDA_CHUNK_TOKENS): forward + backward time and the peak memory
    above the inputs, per tokens-per-chunk, on [64, 1024] and [256, 1024] tokens.
(b) full form (mirror_maps.forms.full_divergence): forward time (no grad) of KL and the neural map per
    positions-per-chunk over V = 151,936, and the working memory above the two logit tensors; forward +
    backward working memory on fewer positions. Working memory is also shown as float32 values per
    vocabulary entry, to check the budget's estimate (_WORK_BYTES_PER_ENTRY).

    python3 bench/sweep_chunks_cuda.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout that is not pip-installed

from mirror_maps import KL, NeuralMirrorMap, forms, full_divergence, fused, sampled_divergence  # noqa: E402

VOCAB = 151_936
MIB = 2**20


def _median_seconds(function, repeats: int) -> float:
    """Median wall time of `function()` after one warm-up call, synchronising the device around each."""
    function()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _peak_above_now(function) -> int:
    """Bytes allocated at the peak of `function()` beyond what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    function()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def sweep_sampled(repeats: int) -> None:
    mirror_map = NeuralMirrorMap.random_init(42).cuda()
    default = fused.CUDA_CHUNK_TOKENS
    print(f"(a) fused sampled form, fwd+bwd, float32, median of {repeats}")
    for rows in (64, 256):
        generator = torch.Generator().manual_seed(0)
        logp = torch.log(torch.rand(rows, 1024, generator=generator) * 0.999 + 1e-3).cuda()
        ref_logp = torch.log(torch.rand(rows, 1024, generator=generator) * 0.999 + 1e-3).cuda()

        def step() -> None:
            x = logp.detach().clone().requires_grad_(True)
            sampled_divergence(mirror_map, x, ref_logp).sum().backward()

        for chunk in (1536, 8192, 16384, 32768, 65536, 131072, 262144):
            if chunk > 2 * logp.numel():
                continue
            fused.CUDA_CHUNK_TOKENS = chunk
            seconds = _median_seconds(step, repeats)
            peak = _peak_above_now(step)
            print(f"    [{rows}, 1024] chunk {chunk:7d}: {seconds * 1e3:8.2f} ms   peak above inputs "
                  f"{peak / MIB:8.1f} MiB")
    fused.CUDA_CHUNK_TOKENS = default


def sweep_full(repeats: int, positions: int, grad_positions: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(8, 512, VOCAB, device="cuda", generator=generator).mul_(3.0)
    ref_logits = torch.randn(8, 512, VOCAB, device="cuda", generator=generator).add_(logits)
    logit_bytes = 2 * logits.numel() * logits.element_size()
    flat, flat_ref = logits.view(-1, VOCAB)[:positions], ref_logits.view(-1, VOCAB)[:positions]
    potentials = {"kl": KL(), "neural": NeuralMirrorMap.random_init(42).cuda()}
    scale = logits.shape[0] * logits.shape[1] / positions
    default_chunk = forms._auto_chunk_size(VOCAB, 4, forms.FULL_FORM_CUDA_CHUNK_BYTES)
    print(f"(b) full form, V = {VOCAB}, two logit tensors {logit_bytes / 2**30:.2f} GiB; forward timed on "
          f"{positions} positions, scaled x{scale:.0f} to 8 x 512; library default chunk on CUDA: {default_chunk}")
    for chunk in sorted({6, 16, 32, 55, 64, 128, 256, default_chunk}):
        line = f"    chunk {chunk:4d}:"
        for name, potential in potentials.items():

            def forward(potential=potential, chunk=chunk) -> None:
                with torch.no_grad():
                    full_divergence(potential, flat, flat_ref, chunk_size=chunk)

            seconds = _median_seconds(forward, repeats) * scale
            work = _peak_above_now(forward)
            per_entry = work / (min(chunk, positions) * VOCAB * 4)
            line += (f"  {name} {seconds:6.3f} s, work {work / MIB:7.1f} MiB ({per_entry:4.1f}/entry, "
                     f"peak {(logit_bytes + work) / logit_bytes:.2f}x logits);")
        print(line)
    print(f"    forward + backward w.r.t. both logits on {grad_positions} positions, neural map:")
    for chunk in (6, 16, 32, 64, 128):
        leaf = flat[:grad_positions].detach().clone().requires_grad_(True)
        leaf_ref = flat_ref[:grad_positions].detach().clone().requires_grad_(True)

        def forward_backward(chunk=chunk) -> None:
            full_divergence(potentials["neural"], leaf, leaf_ref, chunk_size=chunk).sum().backward()
            leaf.grad = leaf_ref.grad = None

        seconds = _median_seconds(forward_backward, 1)
        work = _peak_above_now(forward_backward)
        gradient_bytes = 2 * leaf.numel() * leaf.element_size()
        per_entry = (work - gradient_bytes) / (min(chunk, grad_positions) * VOCAB * 4)
        print(f"    chunk {chunk:4d}: {seconds:6.3f} s, peak above inputs {work / MIB:7.1f} MiB, of which "
              f"{per_entry:5.1f}/entry beside the two logit gradients")
        del leaf, leaf_ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--positions", type=int, default=1024, help="positions timed in (b), of 4,096")
    parser.add_argument("--grad-positions", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this sweep needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    sweep_sampled(args.repeats)
    sweep_full(args.repeats, args.positions, args.grad_positions)


if __name__ == "__main__":
    main()
