"""The tiny model's warm-up ends at a target (pass@1 on a held-out training probe inside a band: of temperature-1
samples by default, or greedy), not at a step count, and the tiny model itself is the same on every CPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import inner_loop.training.warmup as warmup
from inner_loop.config import InnerConfig, ModelConfig
from inner_loop.training.evaluate import EvalResult
from inner_loop.models.loading import load_policy
from inner_loop.models.tiny import tiny_model_dir
from inner_loop.tasks import build_task
from inner_loop.training.warmup import (WarmupTargetError, cpu_capabilities, read_warmup_outcome, split_probe,
                                        warm_up_to_band, warmed_model_dir, warmup_key)
from conf_groups import load_group
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[3]
ARITH = load_group("task", "arith")
SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def _small_cfg(**warm) -> ModelConfig:
    cfg = ModelConfig(**SMALL, warmup_max_steps=50, warmup_probe_size=40, warmup_batch_size=16, warmup_lr=3e-3)
    for key, value in warm.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


@pytest.fixture(scope="module")
def arith():
    task = build_task(ARITH)
    return task, task.load("train")


def test_probe_is_held_out_of_the_demonstrations_and_comes_from_the_training_split(arith):
    task, train = arith
    probe, pairs = split_probe(task, train, 400)
    assert len(probe) == 400 and len(pairs) == len(train) - 400
    probe_prompts = {p.prompt for p in probe}
    assert probe_prompts <= {p.prompt for p in train}
    assert not probe_prompts & {prompt for prompt, _ in pairs}
    assert not probe_prompts & {p.prompt for p in task.load("validation") + task.load("test")}


def test_probe_larger_than_the_training_split_is_refused_naming_the_key(arith):
    task, train = arith
    with pytest.raises(ValueError, match="model.warmup_probe_size=5000"):
        split_probe(task, train, 5000)


@pytest.mark.parametrize("signal", ["sampled", "greedy"])
def test_warmup_stops_at_the_first_check_inside_the_band(arith, monkeypatch, tmp_path, signal):
    """Probe readings 0.10, 0.30, 0.60 (above), 0.50 of the configured signal: stops at the 4th check, whatever the
    step count (the other signal reads 0 throughout, so reading the wrong one never stops)."""
    task, train = arith
    readings = iter([0.10, 0.30, 0.60, 0.50, 0.52])
    checked_at = []

    def scripted_evaluate(model, tokenizer, task_, problems, max_new_tokens, log=True, pass_k=(), **_):
        checked_at.append(len(checked_at))
        value = next(readings)
        sampled = bool(pass_k)
        assert sampled == (signal == "sampled")
        return EvalResult(pass_at_1=0.0 if sampled else value, size=len(problems), mean_response_tokens=1.0,
                          pass_at_k={1: value} if sampled else {})

    monkeypatch.setattr(warmup, "evaluate", scripted_evaluate)
    cfg = _small_cfg(warmup_band=[0.45, 0.55], warmup_check_every=3, warmup_max_steps=100, warmup_signal=signal)
    model, tok = load_policy(cfg, str(tiny_model_dir(cfg, root=tmp_path)))
    probe, pairs = split_probe(task, train, cfg.warmup_probe_size)
    outcome = warm_up_to_band(model, tok, pairs, task, probe, cfg, probe_max_new_tokens=8)
    assert outcome.steps == 12 and outcome.probe_pass_at_1 == 0.50 and len(checked_at) == 4
    assert outcome.band == [0.45, 0.55] and outcome.probe_size == cfg.warmup_probe_size
    assert outcome.cpu_capability == torch.backends.cpu.get_cpu_capability()


def test_the_sampled_probe_is_reproducible_and_leaves_the_training_random_state_alone(arith, tmp_path):
    """The sampled reading draws from a seed of its own (the same reading at the same step, whatever ran before) and
    restores the global generator, so checking more often does not change which batches the warm-up trains on."""
    task, train = arith
    cfg = _small_cfg(warmup_band=[0.0, 1.0])
    model, tok = load_policy(cfg, str(tiny_model_dir(cfg, root=tmp_path)))
    probe, _ = split_probe(task, train, cfg.warmup_probe_size)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = warmup.probe_pass_at_1(model, tok, task, probe, cfg, 8, step=25)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(456)
    assert warmup.probe_pass_at_1(model, tok, task, probe, cfg, 8, step=25) == first


def test_unreachable_band_fails_naming_the_band_and_the_values_reached(arith, tmp_path):
    task, train = arith
    cfg = _small_cfg(warmup_band=[0.99, 1.0], warmup_check_every=5, warmup_max_steps=10)
    model, tok = load_policy(cfg, str(tiny_model_dir(cfg, root=tmp_path)))
    probe, pairs = split_probe(task, train, cfg.warmup_probe_size)
    with pytest.raises(WarmupTargetError) as caught:
        warm_up_to_band(model, tok, pairs, task, probe, cfg, probe_max_new_tokens=8)
    message = str(caught.value)
    for part in ("model.warmup_band=[0.99, 1.0]", "model.warmup_max_steps=10", "last 0.", "highest 0.", "step "):
        assert part in message, message


def test_warmed_model_is_cached_with_its_outcome_and_the_band_is_in_the_key(arith, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRROR_ES_CACHE", str(tmp_path))
    task, _ = arith
    cfg = _small_cfg(warmup_band=[0.0, 1.0], warmup_check_every=5)
    base = str(tiny_model_dir(cfg))
    first = warmed_model_dir(cfg, base, task, ARITH, probe_max_new_tokens=8)
    outcome = read_warmup_outcome(first)
    assert outcome is not None and outcome.steps == 5 and 0.0 <= outcome.probe_pass_at_1 <= 1.0
    assert json.loads((Path(first) / warmup.WARMUP_RECORD).read_text())["band"] == [0.0, 1.0]
    assert warmed_model_dir(cfg, base, task, ARITH, probe_max_new_tokens=8) == first  # cached, not rebuilt
    other_band = _small_cfg(warmup_band=[0.0, 0.9], warmup_check_every=5)
    assert warmup_key(other_band, base, ARITH, 8) != warmup_key(cfg, base, ARITH, 8)
    other_signal = _small_cfg(warmup_band=[0.0, 1.0], warmup_check_every=5, warmup_signal="greedy")
    assert warmup_key(other_signal, base, ARITH, 8) != warmup_key(cfg, base, ARITH, 8)
    assert warmup_key(cfg, base, ARITH, 6) != warmup_key(cfg, base, ARITH, 8)


def _inner(model: dict) -> dict:
    load = load_group
    return {"task": ARITH, "model": {**load("model", "tiny"), **model}, "divergence": load("divergence", "kl"),
            "train": load("train", "default")}


@pytest.mark.parametrize("band", [[0.6, 0.4], [0.5], [-0.1, 0.5], [0.5, 1.5], ["a", 0.5]])
def test_bad_band_is_rejected_up_front_naming_the_key(band):
    inner = _inner({"warmup_band": band})
    with pytest.raises(ValueError, match="model.warmup_band"):
        InnerConfig.from_dict(inner)


def test_an_unknown_warmup_signal_is_rejected_up_front_naming_the_key():
    with pytest.raises(ValueError, match="model.warmup_signal"):
        InnerConfig.from_dict(_inner({"warmup_signal": "beam"}))


def test_zero_check_interval_is_rejected_up_front():
    inner = _inner({"warmup_check_every": 0})
    with pytest.raises(ValueError, match="model.warmup_check_every"):
        InnerConfig.from_dict(inner)


_WEIGHTS_DIGEST = """
import hashlib, sys, torch
from inner_loop.config import ModelConfig
from inner_loop.models.tiny import build_tiny_model, build_tiny_tokenizer
tok = build_tiny_tokenizer()
model = build_tiny_model(ModelConfig(), len(tok), tok)
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest()
print(torch.backends.cpu.get_cpu_capability(), digest)
"""


def test_tiny_model_weights_do_not_depend_on_the_cpu_kernels():
    """torch's float32 normal_ takes a vectorised path on AVX2/AVX-512 and a scalar one otherwise; the tiny
    model must come out bit-identical under both, or two machines sharing a search start from different models."""
    seen = {}
    for capability in cpu_capabilities():  # a capability this CPU lacks dies of SIGILL instead of falling back
        env = {"ATEN_CPU_CAPABILITY": capability, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
        done = run_with_progress([sys.executable, "-c", _WEIGHTS_DIGEST], env=env, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        reported, digest = done.stdout.split()
        seen[reported] = digest
    if len(seen) < 2:
        pytest.skip(f"this CPU offers only {sorted(seen)} kernels; nothing to compare")
    assert len(set(seen.values())) == 1, seen
