"""The embedded default learns: a short fixed-seed `arith` run on the tiny model raises validation pass@1 clearly
above its step-0 value, for each of the divergences the paper compares (KL, ProbL2, neural mirror).

Uses the shipped defaults (conf/task/arith.yaml, conf/model/tiny.yaml, conf/train/default.yaml) unchanged, because
the promise under test is that those defaults give ES a fitness that moves. One warm-up (cached) is shared.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from inner_loop.evaluate import evaluate
from inner_loop.member import train_member
from inner_loop.models.loading import load_policy, resolve_model_dir
from inner_loop.run_setup import prepare
from inner_loop.warmup import read_warmup_outcome, warmed_model_dir
from conf_groups import load_group

CONF = Path(__file__).resolve().parent.parent / "conf"
#: Measured gains from the band-warmed model: +0.10..+0.225 for kl and neural_mirror under default, avx2 and avx512
#: kernels (docs/benchmarks.md); +0.08 still fails when RL does nothing (or drifts down).
MIN_GAIN = 0.08
#: Trust-region hosts: how far below step-0 a run may end and still count as "did not break training".
NO_COLLAPSE_MARGIN = 0.05

pytestmark = pytest.mark.slow


def _default_inner(divergence: str) -> dict:
    load = load_group
    return {"task": load("task", "arith"), "model": load("model", "tiny"),
            "divergence": load("divergence", divergence), "train": load("train", "default")}


@pytest.fixture(scope="module")
def step0_pass_at_1(tmp_path_factory) -> float:
    """Greedy validation pass@1 of the warmed tiny model before any RL (builds the shared cache)."""
    cache = tmp_path_factory.mktemp("mirror-es-cache")
    old = os.environ.get("MIRROR_ES_CACHE")
    os.environ["MIRROR_ES_CACHE"] = str(cache)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = prepare(_default_inner("kl"), seed=0)
        tcfg = run.cfg.train
        warmed = warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model), run.task, run.cfg.task,
                                  probe_max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length)
        outcome = read_warmup_outcome(warmed)
        low, high = run.cfg.model.warmup_band
        assert outcome is not None and low <= outcome.probe_pass_at_1 <= high, outcome
        model, tokenizer = load_policy(run.cfg.model, warmed)
        result = evaluate(model, tokenizer, run.task, run.scored,
                          max_new_tokens=run.cfg.train.max_completion_length)
        assert result.size >= 200
        # Not saturated and not zero: there must be room to improve and a reward to learn from.
        assert 0.1 <= result.pass_at_1 <= 0.8, result.pass_at_1
        yield result.pass_at_1
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("MIRROR_ES_CACHE", None)
        else:
            os.environ["MIRROR_ES_CACHE"] = old


@pytest.mark.parametrize("divergence", ["kl", "prob_l2", "neural_mirror"])
def test_default_arith_run_raises_validation_pass_at_1(step0_pass_at_1, tmp_path, divergence):
    spec = {"run_id": "learn", "generation": 0, "index": 0, "seed": 0, "params": [],
            "work_dir": str(tmp_path / divergence), "inner": _default_inner(divergence)}
    record = train_member(spec)
    assert record.status == "ok", record.error
    assert record.val_size >= 200
    assert record.fitness >= step0_pass_at_1 + MIN_GAIN, (
        f"{divergence}: validation pass@1 {record.fitness:.3f} vs step-0 {step0_pass_at_1:.3f}; "
        f"diagnostics {record.diagnostics}"
    )
    # The regularizer really ran (a silent no-op would make the three runs the same experiment).
    assert record.diagnostics["regularizer_value"] > 0.0


@pytest.mark.parametrize("policy_loss", ["kl3_clip", "dppo_tv", "dppo_kl", "spo", "drpo"])
def test_trust_region_hosts_train_without_collapse_with_two_passes_per_rollout(step0_pass_at_1, tmp_path,
                                                                              policy_loss):
    """Each trust-region host, with two optimiser passes per generation batch (so the policy moves away from the
    rollout's behaviour policy and the trust region acts), trains without losing validation pass@1.

    Weaker than the divergence tests above, on purpose and for now: from the band-warmed model these prob_l2
    two-pass hosts gain only +0.005 (drpo) to +0.065 (dppo_kl) in 60 steps on an AVX-512 CPU, inside the
    model-level jitter of greedy pass@1 at this stage of learning, so "+0.08" would be a coin flip per machine.
    A host that breaks training (the reward collapsing, as lr 1e-3 does: 0.5 -> 0.02) still fails."""
    inner = _default_inner("prob_l2")
    inner["train"].update(policy_loss=policy_loss, num_iterations=2)
    spec = {"run_id": "trust", "generation": 0, "index": 0, "seed": 0, "params": [],
            "work_dir": str(tmp_path / policy_loss), "inner": inner}
    record = train_member(spec)
    assert record.status == "ok", record.error
    assert record.fitness >= step0_pass_at_1 - NO_COLLAPSE_MARGIN, (
        f"{policy_loss}: validation pass@1 {record.fitness:.3f} vs step-0 {step0_pass_at_1:.3f}; "
        f"diagnostics {record.diagnostics}"
    )
    # The second pass saw a ratio away from 1: the trust-region metric was logged and is a real fraction.
    frac = [v for k, v in record.diagnostics.items() if k.startswith("trust_region/") and k.endswith("_frac")]
    assert frac and all(0.0 <= v <= 1.0 for v in frac), record.diagnostics
