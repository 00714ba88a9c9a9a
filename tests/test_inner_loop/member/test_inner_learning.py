"""The embedded default learns: short `arith` runs on the tiny model raise the reward RL optimises, for each of the
divergences the paper compares (KL, ProbL2, neural mirror), without losing validation pass@1, and the trust-region
hosts train without collapsing.

Uses the shipped defaults (conf/task/arith.yaml, conf/model/tiny.yaml, conf/train/default.yaml) unchanged, because
the promise under test is that those defaults give ES a member that really trains. Every run goes through the member's
entry point, so it computes under the tiny preset's pinned numerics (inner_loop/process/pinned.py) in a process of its
own. The claims are over several seeds, with margin, not the outcome of one chaotic run.

What is claimed, and why not "greedy validation pass@1 rises by 0.05": greedy pass@1 of this model is a jumpy
function of its weights (between warm-up checks 25 steps apart: 0.51, 0.26, 0.58, 0.37, 0.55, 0.73), so a gain over
step-0 mostly measures where the start iterate sits in that noise. An earlier version of this test asserted a pooled
greedy gain above +0.05; it held on an AMD EPYC (+0.13) and failed on an Intel Xeon (-0.03) whose pinned numbers
differ, from starts that were a low and a high draw of it. The reward RL optimises, the pass rate of the samples of
each step's fresh prompts (60 steps x 32 prompts of 4,000: no prompt is seen twice), is smooth and measured on prompts
the policy has not trained on. Measured (Intel Xeon, pinned; mean reward of the last 10 steps minus the first 10,
seeds 0 / 1 / 2): kl +0.044 / +0.095 / +0.055, prob_l2 +0.027 / +0.121 / +0.066, neural_mirror +0.041 / +0.139 /
+0.080; greedy validation pass@1 from step-0 0.625: kl -0.01 / -0.03 / +0.085, prob_l2 +0.01 / -0.08 / +0.07,
neural_mirror +0.035 / +0.145 / -0.045 (a collapse goes 0.5 -> 0.02). Trust-region hosts, prob_l2, two passes, seed
0, 15 steps: the reward of the last 3 rollouts against the first 3 kl3_clip 0.277 -> 0.279, dppo_tv 0.268 -> 0.256,
dppo_kl 0.271 -> 0.262, spo 0.245 -> 0.259, drpo 0.262 -> 0.259; validation 0.61, 0.495, 0.46, 0.525, 0.48.
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
from helpers import member_spec

#: Seeds per divergence; per trust-region host: one, whose claim (no collapse) is weaker and whose runs are shorter.
#: A collapse takes the reward to ~0, so one seed shows it.
SEEDS = (0, 1, 2)
TRUST_SEEDS = (0,)
#: Training steps of a trust-region run: a host that breaks training collapses the reward within ~10 steps.
TRUST_STEPS = 15
#: Rollouts averaged at each end of a run to read the reward's change (a step's reward: 256 samples of 32 prompts).
REWARD_WINDOW = 10
TRUST_REWARD_WINDOW = 3
#: The 95% interval of the mean reward gain over every divergence and seed must lie above this (measured: mean
#: +0.074, interval [+0.046, +0.102]); RL that does nothing has a mean gain near 0.
MIN_POOLED_REWARD_GAIN = 0.02
#: Every run's reward must rise (measured: the lowest +0.027).
MIN_REWARD_GAIN = 0.0
#: No run's greedy validation pass@1 may end further below step-0 than this (measured: the lowest -0.08; a collapse
#: loses ~0.5).
MAX_VALIDATION_LOSS = 0.15
#: Trust-region hosts: how far the reward of the last rollouts may fall below the first ones' (measured: at most
#: -0.012) and greedy validation below step-0 (measured: at most -0.165 from a step-0 of 0.625) and still count as
#: "did not break training"; a collapse takes both to ~0.
TRUST_REWARD_DROP = 0.08
NO_COLLAPSE_MARGIN = 0.3
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
    return member_spec(work_dir, inner, run_id="learn", seed=seed)


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


def _rewards(work_dir: Path) -> list[float]:
    """The run's reward per rollout (its TensorBoard log: train/reward, one value per generation batch)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(work_dir.glob("tensorboard_logs/**/events.out.tfevents.*"))
    assert events, f"{work_dir}: no TensorBoard log"
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars("train/reward")]


def _reward_gain(work_dir: Path, window: int) -> float:
    rewards = _rewards(work_dir)
    assert len(rewards) >= 2 * window, f"{work_dir}: {len(rewards)} rollouts logged"
    return statistics.mean(rewards[-window:]) - statistics.mean(rewards[:window])


def test_default_arith_runs_raise_the_reward_over_divergences_and_seeds(runs, learning_root):
    gains = [_reward_gain(learning_root / f"{name}_{seed}", REWARD_WINDOW) for name in DIVERGENCES for seed in SEEDS]
    low, high = mean_interval(gains)
    assert low > MIN_POOLED_REWARD_GAIN, (
        f"reward gains {gains}: mean {statistics.mean(gains):+.3f} [{low:+.3f}, {high:+.3f}]")


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_each_divergence_trains_in_every_seed(runs, step0_pass_at_1, learning_root, divergence):
    records = [runs[(divergence, seed)] for seed in SEEDS]
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    rewards = [_reward_gain(learning_root / f"{divergence}_{seed}", REWARD_WINDOW) for seed in SEEDS]
    validation = [r.fitness - step0_pass_at_1 for r in records]
    report = f"{divergence}: reward gains {rewards}, validation gains {validation} over step-0 {step0_pass_at_1:.3f}"
    assert min(rewards) > MIN_REWARD_GAIN, report
    assert min(validation) > -MAX_VALIDATION_LOSS, report
    # The regularizer really ran in every seed (a silent no-op would make the three divergences one experiment).
    assert all(r.diagnostics["regularizer_value"] > 0.0 for r in records)


@pytest.mark.parametrize("policy_loss", TRUST_REGIONS)
def test_trust_region_hosts_train_without_collapse_with_two_passes_per_rollout(runs, step0_pass_at_1, learning_root,
                                                                              policy_loss):
    """Each trust-region host trains without collapsing (one seed: TRUST_SEEDS).

    Weaker than the divergence test above, on purpose: in 15 steps these prob_l2 two-pass hosts move the reward
    little, so a gain would be a claim about seed noise. A host that breaks training (the reward collapsing, as lr
    1e-3 does: validation 0.5 -> 0.02) still fails."""
    records = [runs[(policy_loss, seed)] for seed in TRUST_SEEDS]
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    values = [r.fitness for r in records]
    rewards = [_reward_gain(learning_root / f"{policy_loss}_{seed}", TRUST_REWARD_WINDOW) for seed in TRUST_SEEDS]
    report = f"{policy_loss}: validation pass@1 {values} vs step-0 {step0_pass_at_1:.3f}, reward changes {rewards}"
    assert statistics.mean(values) >= step0_pass_at_1 - NO_COLLAPSE_MARGIN, report
    assert min(rewards) > -TRUST_REWARD_DROP, report
    # The second pass saw a ratio away from 1: the trust-region metric was logged and is a real fraction.
    for record in records:
        frac = [v for k, v in record.diagnostics.items() if k.startswith("trust_region/") and k.endswith("_frac")]
        assert frac and all(0.0 <= v <= 1.0 for v in frac), record.diagnostics
