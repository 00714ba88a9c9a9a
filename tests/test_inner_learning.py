"""The embedded default learns: short `arith` runs on the tiny model raise validation pass@1 above the untrained
model's, for each of the divergences the paper compares (KL, ProbL2, neural mirror), and the trust-region hosts train
without collapsing.

Uses the shipped defaults (conf/task/arith.yaml, conf/model/tiny.yaml, conf/train/default.yaml) unchanged, because
the promise under test is that those defaults give ES a fitness that moves. Every run goes through the member's entry
point, so it computes under the tiny preset's pinned numerics (inner_loop/process/pinned.py) in a process of its own: the
numbers are those of every machine whose `python -m inner_loop.fingerprint` matches, not of this CPU's kernels. The
claims are over several seeds, with margin, not the outcome of one chaotic run.

Measured under pinned numerics (step-0 0.495; validation pass@1 after 60 steps, seeds 0 / 1 / 2): kl 0.635 / 0.605 /
0.66, prob_l2 0.665 / 0.665 / 0.65, neural_mirror (the authors' coefficient 1e-4) 0.665 / 0.59 / 0.52. Trust-region
hosts, prob_l2, two passes, seed 0, 15 steps: kl3_clip 0.61, dppo_tv 0.54, dppo_kl 0.555, spo 0.53, drpo 0.555 (at
30 steps: 0.605, 0.395, 0.475, 0.57, 0.47; binary-TV masking at delta 0.15 loses ~0.1 there: reported, not a
collapse).
"""
from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inner_loop.member.entry import train_member
from results.report.paired import mean_interval
from results.store.provenance import read_run_manifest
from core.records import ResultRecord
from conf_groups import load_group

#: Seeds per divergence; per trust-region host: one, whose claim (no collapse) is weaker and whose runs are shorter.
#: A collapse goes 0.5 -> 0.02, so one seed shows it; pinned numerics make seed 0's outcome the same on every machine
#: (measured at TRUST_STEPS: every host ends above step-0, the weakest, spo, +0.035).
SEEDS = (0, 1, 2)
TRUST_SEEDS = (0,)
#: Training steps of a trust-region run: a host that breaks training collapses the reward within ~10 steps.
TRUST_STEPS = 15
#: The 95% interval of the mean gain over every divergence and seed must lie above this (measured: mean +0.133,
#: interval [+0.096, +0.171]); a run where RL does nothing, or drifts down, has a mean gain near or below 0.
MIN_POOLED_GAIN = 0.05
#: Each divergence's mean gain over its seeds must reach this (measured: kl +0.138, prob_l2 +0.165, neural_mirror
#: +0.097).
MIN_GAIN = 0.05
#: No single run may end further below step-0 than this (measured: the lowest run gained +0.025).
MAX_LOSS = 0.05
#: Trust-region hosts: how far below step-0 a host's mean may end and still count as "did not break training"
#: (a collapse, as lr 1e-3 gives, goes 0.5 -> 0.02; at TRUST_STEPS every host measured ends above step-0).
NO_COLLAPSE_MARGIN = 0.15
DIVERGENCES = ("kl", "prob_l2", "neural_mirror")
TRUST_REGIONS = ("kl3_clip", "dppo_tv", "dppo_kl", "spo", "drpo")

pytestmark = pytest.mark.slow


def _default_inner(divergence: str, **train: object) -> dict:
    load = load_group
    inner = {"task": load("task", "arith"), "model": load("model", "tiny"),
             "divergence": load("divergence", divergence), "train": load("train", "default")}
    inner["train"].update(train)
    return inner


def _spec(work_dir: Path, inner: dict, seed: int) -> dict:
    return {"run_id": "learn", "generation": 0, "index": 0, "seed": seed, "params": [], "work_dir": str(work_dir),
            "inner": inner}


@pytest.fixture(scope="module")
def learning_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("learning")


@pytest.fixture(scope="module")
def runs(learning_root) -> dict[tuple[str, int], ResultRecord]:
    """Every run of this module, two at a time (each is one pinned, single-threaded process): the untrained model
    (0 steps, which also builds the shared warm-up first), then each divergence and each trust-region host per seed.
    A trust-region host runs two optimiser passes per generation batch, so the policy moves away from the rollout's
    behaviour policy and the trust region acts."""
    root = learning_root
    base = train_member(_spec(root / "untrained", _default_inner("kl", steps=0), 0))
    jobs = {(name, seed): _spec(root / f"{name}_{seed}", _default_inner(name), seed)
            for name in DIVERGENCES for seed in SEEDS}
    jobs.update({(host, seed): _spec(root / f"{host}_{seed}",
                                     _default_inner("prob_l2", policy_loss=host, num_iterations=2, steps=TRUST_STEPS),
                                     seed)
                 for host in TRUST_REGIONS for seed in TRUST_SEEDS})
    with ThreadPoolExecutor(max_workers=2) as pool:
        records = dict(zip(jobs, pool.map(train_member, jobs.values())))
    records[("untrained", 0)] = base
    return records


@pytest.fixture(scope="module")
def step0_pass_at_1(runs, learning_root) -> float:
    """Greedy validation pass@1 of the warmed tiny model before any RL."""
    record = runs[("untrained", 0)]
    assert record.status == "ok" and record.steps_done == 0, record.error
    # trained in a pinned process of its own (this test process computes with other kernels), and says so
    numerics = read_run_manifest(learning_root / "untrained")["numerics"]
    assert numerics["pinned"] and numerics["torch_threads"] == 1, numerics
    assert record.val_size >= 200
    # Not saturated and not zero: there must be room to improve and a reward to learn from.
    assert 0.1 <= record.fitness <= 0.8, record.fitness
    return record.fitness


def test_default_arith_runs_raise_validation_pass_at_1_over_divergences_and_seeds(runs, step0_pass_at_1):
    gains = [runs[(name, seed)].fitness - step0_pass_at_1 for name in DIVERGENCES for seed in SEEDS]
    low, high = mean_interval(gains)
    assert low > MIN_POOLED_GAIN, f"gains {gains}: mean {statistics.mean(gains):+.3f} [{low:+.3f}, {high:+.3f}]"


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_each_divergence_learns_in_every_seed(runs, step0_pass_at_1, divergence):
    records = [runs[(divergence, seed)] for seed in SEEDS]
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    gains = [r.fitness - step0_pass_at_1 for r in records]
    report = f"{divergence}: gains {gains} over step-0 {step0_pass_at_1:.3f}"
    assert statistics.mean(gains) >= MIN_GAIN and min(gains) > -MAX_LOSS, report
    # The regularizer really ran in every seed (a silent no-op would make the three divergences one experiment).
    assert all(r.diagnostics["regularizer_value"] > 0.0 for r in records)


@pytest.mark.parametrize("policy_loss", TRUST_REGIONS)
def test_trust_region_hosts_train_without_collapse_with_two_passes_per_rollout(runs, step0_pass_at_1, policy_loss):
    """Each trust-region host trains without losing validation pass@1 (one seed: TRUST_SEEDS).

    Weaker than the divergence test above, on purpose: from the band-warmed model these prob_l2 two-pass hosts gain
    little in 60 steps, so a gain would be a claim about seed noise. A host that breaks training (the reward
    collapsing, as lr 1e-3 does: 0.5 -> 0.02) still fails."""
    records = [runs[(policy_loss, seed)] for seed in TRUST_SEEDS]
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    values = [r.fitness for r in records]
    assert statistics.mean(values) >= step0_pass_at_1 - NO_COLLAPSE_MARGIN, (
        f"{policy_loss}: validation pass@1 {values} vs step-0 {step0_pass_at_1:.3f}")
    # The second pass saw a ratio away from 1: the trust-region metric was logged and is a real fraction.
    for record in records:
        frac = [v for k, v in record.diagnostics.items() if k.startswith("trust_region/") and k.endswith("_frac")]
        assert frac and all(0.0 <= v <= 1.0 for v in frac), record.diagnostics
