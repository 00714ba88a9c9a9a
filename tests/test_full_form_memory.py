"""The full divergence form's memory at Qwen3's vocabulary (151,936): a full-form step (loss + backward, with the
per-step gradient-share norms) takes at most a small multiple of the batch's logits more than a sampled-form step,
and the pieces that bound it (vocabulary slices in mirror_maps.forms and in the norms) change no value.

Before: h' of the neural map ran over a chunk's whole logits for the norms (126 numbers per entry), ~430x the
logits: 8.4 GB more than the sampled form for 2 completions of 16 tokens."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from inner_loop.loss import grad_share
from inner_loop.loss.grad_share import full_form_token_norms
from mirror_maps import NeuralMirrorMap, forms
from mirror_maps.forms import full_divergence
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parent.parent
#: the most a full-form step may take beyond a sampled-form step, in multiples of the batch's float32 logits
#: (measured: 2.1x for the probe's 2 completions of 8 tokens)
EXTRA_PEAK_LOGITS = 4.0


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_a_full_form_step_at_qwen3_vocabulary_takes_a_bounded_multiple_of_its_logits():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = run_with_progress([sys.executable, str(ROOT / "tests" / "full_form_memory_probe.py"), "full", "sampled"],
                             env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    peaks, logits_bytes = measured["peaks"], measured["logits_bytes"]
    extra = (peaks["full"] - peaks["sampled"]) / logits_bytes
    assert extra <= EXTRA_PEAK_LOGITS, (
        f"a full-form step took {extra:.1f}x the batch's logits ({logits_bytes / 2**20:.1f} MiB) more than the "
        f"sampled form: {peaks}")


def _norms_at_once(potential, logits, ref_logits, targets):
    """The closed form over the whole tensors at once (what the trainer computed before the slices)."""
    p = torch.log_softmax(logits.float(), dim=-1).exp()
    q = torch.softmax(ref_logits.float(), dim=-1)
    p_y = p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    u = potential.h_prime(p) - potential.h_prime(q)
    grad = p * (u - (p * u).sum(-1, keepdim=True))
    return (1.0 - 2.0 * p_y + p.pow(2).sum(-1)).clamp_min(0.0).sqrt(), grad.pow(2).sum(-1).sqrt()


@pytest.mark.parametrize("workspace", [None, 4096, 600_000])  # the default; slices of 2 entries; rows of a few
def test_the_sliced_norms_equal_the_closed_form_at_once(workspace):
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 97, generator=generator) * 3
    ref_logits = logits + 0.3 * torch.randn(3, 5, 97, generator=generator)
    targets = torch.randint(0, 97, (3, 5), generator=generator)
    potential = NeuralMirrorMap.random_init(7, scale=0.3)
    expected = _norms_at_once(potential, logits, ref_logits, targets)
    got = full_form_token_norms(potential, logits, ref_logits, targets, workspace_bytes=workspace)
    for value, reference in zip(got, expected):  # float32 (as the trainer computes them): h' of a slice sums its
        assert value.shape == (3, 5)  # 126 neurons in another order than of the whole, a few units of roundoff
        torch.testing.assert_close(value, reference, rtol=5e-5, atol=1e-7)


def test_the_norms_work_in_slices_at_qwen3_vocabulary(monkeypatch):
    """Every h' call gets at most the workspace's entries (the cause of the 8 GB peak was one call on all of them)."""
    potential = NeuralMirrorMap.random_init(42)
    sizes: list[int] = []
    h_prime = potential.h_prime
    monkeypatch.setattr(potential, "h_prime", lambda y: sizes.append(y.numel()) or h_prime(y))
    logits = torch.randn(1, 2, 151_936)
    full_form_token_norms(potential, logits, logits + 0.1, torch.zeros(1, 2, dtype=torch.long))
    workspace = grad_share._norm_workspace_bytes(logits)
    assert sum(sizes) == 2 * logits.numel()  # h'(p) and h'(q) over every entry
    assert max(sizes) * grad_share.H_PRIME_BYTES_PER_ENTRY <= workspace


def test_vocabulary_slices_change_neither_the_full_divergence_nor_its_gradient(monkeypatch):
    potential = NeuralMirrorMap.random_init(9, scale=0.3, dtype=torch.float64)
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 3, 50, generator=generator, dtype=torch.float64) * 2).requires_grad_(True)
    ref_logits = torch.randn(2, 3, 50, generator=generator, dtype=torch.float64)
    whole = full_divergence(potential, logits, ref_logits)  # one slice: the inputs are under the least budget
    (whole_grad,) = torch.autograd.grad(whole.sum(), logits)
    monkeypatch.setattr(forms, "_MIN_WORK_BYTES", 2 * forms._WORK_BYTES_PER_ENTRY * 7)  # one row a chunk, 14 entries a slice
    monkeypatch.setattr(forms, "_ROW_TENSORS", 50)
    sliced = full_divergence(potential, logits, ref_logits)
    (sliced_grad,) = torch.autograd.grad(sliced.sum(), logits)
    torch.testing.assert_close(sliced, whole, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(sliced_grad, whole_grad, rtol=1e-10, atol=1e-15)
