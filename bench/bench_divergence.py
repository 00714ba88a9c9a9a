"""Divergence speed and memory, measured side by side in one run.

(a) Neural-mirror sampled form, forward + backward on [64, 1024] tokens: the vectorised library against a
    reference that loops over the 126 neurons one at a time with the textbook H(p) - H(q) - s(u_q)(p - q),
    the way the authors' code does. Target: >= 20x.
(b) Full form over a 151,936-token vocabulary for 8 x 512 positions: neural mirror vs KL time, and peak
    memory vs the two logit tensors. Targets: time <= 3x KL, memory <= 2x the logits. Each full-form
    variant runs in a fresh subprocess so its peak RSS (CPU) or max_memory_allocated (CUDA) is its own.

    python bench/bench_divergence.py                      # everything at the issue's sizes
    python bench/bench_divergence.py --timed-positions 64  # run (b) on the first 64 positions only
    python bench/bench_divergence.py --skip full --no-compile --threads 1  # (a) only, one intra-op thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout that is not pip-installed

from mirror_maps import KL, NeuralMirrorMap, full_divergence, sampled_divergence  # noqa: E402
from mirror_maps.neurons import LOG_OFFSET, NEURONS_PER_BLOCK  # noqa: E402

VOCAB = 151_936


# ---------------------------------------------------------------- (a) looping reference, authors' style
def _antiderivative(kind: int, u: torch.Tensor) -> torch.Tensor:
    if kind == 0:
        return u**4 / 4
    if kind == 1:
        return u**3 / 3
    if kind == 2:
        return (2.0 / 3.0) * u.clamp_min(0) ** 1.5
    if kind == 3:
        return 0.75 * u.clamp_min(0) ** (4.0 / 3.0)
    if kind == 4:
        x = u.clamp_min(0) + LOG_OFFSET
        return x * torch.log(x) - x + torch.clamp(u, max=0) * torch.log(torch.tensor(LOG_OFFSET))
    return torch.exp(u)


def _activation(kind: int, u: torch.Tensor) -> torch.Tensor:
    if kind == 0:
        return u**3
    if kind == 1:
        return u**2
    if kind == 2:
        return torch.sqrt(u.clamp_min(0))
    if kind == 3:
        return u.clamp_min(0) ** (1.0 / 3.0)
    if kind == 4:
        return torch.log(u.clamp_min(0) + LOG_OFFSET)
    return torch.exp(u)


def looping_reference(mirror_map: NeuralMirrorMap, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_j v_j [H_j(p) - H_j(q) - s_j(u_q)(p - q)] with H_j = (S(u) - S(b)) / w_j, one neuron per step."""
    v, w, b, a, c = mirror_map.parameters_for(p.dtype)
    total = 0.5 * a * (p - q) ** 2 + c * (p * torch.log(p / q) - p + q)
    for j in range(v.numel()):
        kind = j // NEURONS_PER_BLOCK
        u_p, u_q = w[j] * p + b[j], w[j] * q + b[j]
        if abs(float(w[j])) > 1e-8:
            h_p = (_antiderivative(kind, u_p) - _antiderivative(kind, b[j])) / w[j]
            h_q = (_antiderivative(kind, u_q) - _antiderivative(kind, b[j])) / w[j]
        else:
            h_p, h_q = _activation(kind, b[j]) * p, _activation(kind, b[j]) * q
        total = total + v[j] * (h_p - h_q - _activation(kind, u_q) * (p - q))
    return total


def _forward_backward_seconds(function, logp: torch.Tensor, ref_logp: torch.Tensor) -> float:
    x = logp.detach().clone().requires_grad_(True)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    function(x, ref_logp).sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _interleaved(functions: dict, repeats: int, *args) -> dict[str, float]:
    """Median seconds per variant, the variants alternating call by call so load changes hit all alike."""
    for function in functions.values():  # warm-up
        function(*args)
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            samples[name].append(function(*args))
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_sampled(device: str, repeats: int, compile_too: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    mirror_map = NeuralMirrorMap.random_init(42).to(device)
    logp = torch.log(torch.rand(64, 1024, generator=generator) * 0.999 + 1e-3).to(device)
    ref_logp = torch.log(torch.rand(64, 1024, generator=generator) * 0.999 + 1e-3).to(device)

    def library(x, ref):
        return sampled_divergence(mirror_map, x, ref, form="sampled")

    def reference(x, ref):
        return looping_reference(mirror_map, torch.exp(x).clamp_min(1e-10), torch.exp(ref).clamp_min(1e-10))

    variants = {"reference": reference, "library": library}
    compile_seconds = None
    if compile_too:
        compiled = torch.compile(library, dynamic=False)
        start = time.perf_counter()
        compiled(logp.detach().clone().requires_grad_(True), ref_logp).sum().backward()
        compile_seconds = time.perf_counter() - start
        variants["compiled"] = compiled
    timers = {name: (lambda f: lambda: _forward_backward_seconds(f, logp, ref_logp))(f) for name, f in variants.items()}
    seconds = _interleaved(timers, repeats)
    tokens = logp.numel()
    slow = seconds["reference"]
    print(f"(a) neural-mirror sampled form, forward+backward, [64, 1024] tokens, float32, {device}, "
          f"median of {repeats} interleaved runs")
    print(f"    looping reference : {slow * 1e3:9.1f} ms  {tokens / slow / 1e6:8.3f} Mtok/s")
    labels = {"library": "library (fused)   ", "compiled": "+ torch.compile   "}
    for name in [n for n in ("library", "compiled") if n in seconds]:
        extra = f"   (one-off compile {compile_seconds:.0f} s)" if name == "compiled" else ""
        print(f"    {labels[name]}: {seconds[name] * 1e3:9.1f} ms  {tokens / seconds[name] / 1e6:8.3f} Mtok/s"
              f"   {slow / seconds[name]:6.1f}x{extra}")
    print("    target: library >= 20x the looping reference")


# ---------------------------------------------------------------- (b) full form, one variant per process
def _status_bytes(field: str) -> int:
    """VmRSS / VmHWM of this process from /proc (VmHWM is per address space, so it restarts at exec)."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _make_logits(batch: int, length: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [batch, length, V] logit tensors, built in place so no third tensor ever exists."""
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(batch, length, VOCAB, device=device, generator=generator).mul_(3.0)
    ref_logits = torch.randn(batch, length, VOCAB, device=device, generator=generator).add_(logits)
    return logits, ref_logits


def _potential(variant: str, device: str):
    return KL() if variant == "kl" else NeuralMirrorMap.random_init(42).to(device)


def full_form_memory_worker(variant: str, device: str, batch: int, length: int, positions: int) -> dict:
    """Subprocess: peak memory of one variant, counted from before the logits were allocated."""
    baseline = _status_bytes("VmRSS")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    logits, ref_logits = _make_logits(batch, length, device)
    logit_bytes = 2 * logits.numel() * logits.element_size()
    flat, flat_ref = logits.view(-1, VOCAB)[:positions], ref_logits.view(-1, VOCAB)[:positions]
    with torch.no_grad():
        result = full_divergence(_potential(variant, device), flat, flat_ref)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _status_bytes("VmHWM") - baseline
    return {"peak_bytes": peak, "logit_bytes": logit_bytes, "finite": bool(torch.isfinite(result).all())}


def bench_full(device: str, batch: int, length: int, timed_positions: int, repeats: int) -> None:
    memory = {}
    for variant in ("kl", "neural_mirror"):
        command = [sys.executable, __file__, "--worker", variant, "--device", device, "--batch", str(batch),
                   "--length", str(length), "--timed-positions", str(timed_positions)]
        completed = subprocess.run(command, capture_output=True, text=True, check=True)
        memory[variant] = json.loads(completed.stdout.strip().splitlines()[-1])
    logits, ref_logits = _make_logits(batch, length, device)
    flat, flat_ref = logits.view(-1, VOCAB)[:timed_positions], ref_logits.view(-1, VOCAB)[:timed_positions]
    del logits, ref_logits

    def timer(variant):
        potential = _potential(variant, device)

        def run() -> float:
            start = time.perf_counter()
            with torch.no_grad():
                full_divergence(potential, flat, flat_ref)
            if device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        return run

    seconds = _interleaved({"kl": timer("kl"), "neural_mirror": timer("neural_mirror")}, repeats)
    positions = batch * length
    scale = positions / timed_positions
    gib = 2**30
    print(f"(b) full form over V={VOCAB}, {batch} x {length} positions, float32, {device}, forward (no grad)")
    if timed_positions != positions:
        print(f"    timed on the first {timed_positions} positions (median of {repeats} interleaved runs), "
              f"scaled x{scale:.0f};\n    memory: full-size logits allocated, peak over a run on those positions (chunks repeat)")
    print(f"    two logit tensors : {memory['kl']['logit_bytes'] / gib:6.2f} GiB")
    for name, variant in (("KL", "kl"), ("neural mirror", "neural_mirror")):
        peak = memory[variant]["peak_bytes"]
        print(f"    {name:14s}: {seconds[variant] * scale:8.2f} s   peak {peak / gib:6.2f} GiB incl. the logits "
              f"= {peak / memory[variant]['logit_bytes']:.2f}x the logits   finite={memory[variant]['finite']}")
    print(f"    time ratio neural/KL: {seconds['neural_mirror'] / seconds['kl']:.2f}x   (target <= 3x; memory <= 2x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--timed-positions", type=int, default=None, help="time (b) on this many positions")
    parser.add_argument("--skip", choices=["sampled", "full"], default=None)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant of (a)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's); 1 shows timings free of the stalls a "
                             "2-thread op suffers when another process holds the second core")
    parser.add_argument("--worker", choices=["kl", "neural_mirror"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    positions = args.batch * args.length
    timed = positions if args.timed_positions is None else min(args.timed_positions, positions)
    if args.worker:
        print(json.dumps(full_form_memory_worker(args.worker, args.device, args.batch, args.length, timed)))
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    if args.skip != "sampled":
        bench_sampled(args.device, args.repeats, compile_too=not args.no_compile)
    if args.skip != "full":
        bench_full(args.device, args.batch, args.length, timed, args.repeats)


if __name__ == "__main__":
    main()
