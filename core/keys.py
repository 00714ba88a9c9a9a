"""The names every room shares: the values a training run logs, the diagnostics a member's result record keeps, and
the keys a member's inner config carries from its resources.

One owner per name: the trainer appends a value under one of these keys, and the readers (the result's
diagnostics, progress.json, the inertness warning, benchmarks) look it up under the same constant, so renaming a
metric is one edit here instead of a silent miss in a reader. tests/test_core/test_metric_keys.py fails on any of these
names spelled as a string literal elsewhere in the packages or the benchmarks.

It lives on the ground floor (core/) because the diagnostic names are part of the result record (core/records.py)
and every room that logs or reads them may import it, as the typed inner config reads the member keys (and the
messages of the GPU share name them: share_keys); standard library only, imports nothing.
"""
from __future__ import annotations

# --- TRL's GRPOTrainer logs these (its names: read by us, never appended by us)
#: mean reward of the step's completions
REWARD = "reward"
#: share of the step's groups whose rewards are all equal (no advantage, no learning signal)
FRAC_REWARD_ZERO_STD = "frac_reward_zero_std"
#: share of completions cut at max_completion_length
COMPLETIONS_CLIPPED_RATIO = "completions/clipped_ratio"
#: mean completion length in tokens
COMPLETIONS_MEAN_LENGTH = "completions/mean_length"
#: seconds of one optimizer step (generation, loss, backward, update)
STEP_TIME = "step_time"
#: with vLLM generation: mean |log-prob of the sampler - log-prob of the trained policy| of the sampled tokens
SAMPLING_LOGP_DIFFERENCE = "sampling/sampling_logp_difference/mean"
#: with vLLM generation: the mean importance-sampling ratio (trained policy / sampler) our loss weights tokens by
IMPORTANCE_SAMPLING_RATIO = "sampling/importance_sampling_ratio/mean"

# --- our trainer logs these (inner_loop/grpo/trainer.py)
#: the aggregated policy term
POLICY_LOSS = "policy_loss"
#: the aggregated divergence D, before the coefficient
REGULARIZER_VALUE = "regularizer/value"
#: ||grad coef*D|| / ||grad policy term|| per batch, in the space the loss sees (inner_loop/loss/grad_share.py)
GRAD_SHARE = "regularizer/grad_share"
#: the same share, once per run, exactly w.r.t. the trainable parameters
GRAD_SHARE_EXACT = "regularizer/grad_share_exact"
#: the optimizer step at which GRAD_SHARE_EXACT was measured
GRAD_SHARE_EXACT_STEP = "regularizer/grad_share_exact_step"
#: wall seconds of one optimizer step spent generating (TRL's ``_generate``: the decode, whatever the backend), beside
#: STEP_TIME: what is left of the step (log-probs, loss, backward, update, rewards) is measured, not guessed
GENERATE_TIME = "generate_time"
#: prefixes of the policy term's own metrics (clipping, trust-region masks, mean ratio), kept under their names
CLIP_RATIO_PREFIX = "clip_ratio/"
TRUST_REGION_PREFIX = "trust_region/"
POLICY_METRIC_PREFIXES = (CLIP_RATIO_PREFIX, TRUST_REGION_PREFIX)

# --- the result record's diagnostics: the mean over the logged steps of a logged value (inner_loop/training/diagnostics.py)
REWARD_MEAN = "reward_mean"
ZERO_VARIANCE_GROUP_FRAC = "zero_variance_group_frac"
CLIPPED_COMPLETION_RATIO = "clipped_completion_ratio"
REGULARIZER_VALUE_MEAN = "regularizer_value"
#: what the inertness check (divergence.grad_share_floor) reads: the mean per-step gradient share
GRAD_SHARE_DIAGNOSTIC = "regularizer_grad_share"
GRAD_SHARE_EXACT_DIAGNOSTIC = "regularizer_grad_share_exact"
GRAD_SHARE_EXACT_STEP_DIAGNOSTIC = "regularizer_grad_share_exact_step"
STEP_TIME_MEAN = "step_time_mean"
GENERATE_TIME_MEAN = "generate_time_mean"
SAMPLING_LOGP_DIFFERENCE_MEAN = "sampling_logp_difference_mean"
IMPORTANCE_SAMPLING_RATIO_MEAN = "importance_sampling_ratio_mean"

#: every name above that is a whole key (the prefixes are matched as prefixes)
KEYS = (REWARD, FRAC_REWARD_ZERO_STD, COMPLETIONS_CLIPPED_RATIO, COMPLETIONS_MEAN_LENGTH, STEP_TIME, POLICY_LOSS,
        REGULARIZER_VALUE, GRAD_SHARE, GRAD_SHARE_EXACT, GRAD_SHARE_EXACT_STEP, REWARD_MEAN, ZERO_VARIANCE_GROUP_FRAC,
        CLIPPED_COMPLETION_RATIO, REGULARIZER_VALUE_MEAN, GRAD_SHARE_DIAGNOSTIC, GRAD_SHARE_EXACT_DIAGNOSTIC,
        GRAD_SHARE_EXACT_STEP_DIAGNOSTIC, SAMPLING_LOGP_DIFFERENCE, IMPORTANCE_SAMPLING_RATIO, STEP_TIME_MEAN,
        SAMPLING_LOGP_DIFFERENCE_MEAN, IMPORTANCE_SAMPLING_RATIO_MEAN, GENERATE_TIME, GENERATE_TIME_MEAN)

# --- keys a member's inner config carries from its resources (the typed inner config reads them)
#: the inner-config key of a member whose resources ask for GPUs (resources.gpus >= 1): how many. The member refuses
#: to train without a usable GPU (inner_loop/member/device.py); absent: a CPU member, or one that takes what it finds
MEMBER_GPUS_KEY = "gpus"
#: the inner-config key of a GPU member's share of its GPU's memory (resources.gpu_memory_fraction; absent: all of it,
#: one member per GPU): its generation cache and the full form's chunks are sized from that budget, never from what
#: the device has free (members packed on one GPU would each take the others' memory)
MEMBER_GPU_MEMORY_KEY = "gpu_memory_fraction"
#: the inner-config key of a GPU member that shares its GPU with others (resources.members_per_gpu >= 2): how many
#: members share it. Its memory share (MEMBER_GPU_MEMORY_KEY) is already divided by it; the member names both when
#: it runs out of memory, and staggers its vLLM engine's start with the others on the card
MEMBER_GPU_SHARERS_KEY = "members_per_gpu"
#: the environment variable a packed SLURM task sets for each member it starts: how many of its members it started
#: together on the card. Fewer than members_per_gpu (the odd member of a generation, a requeued task's survivors):
#: each takes the card divided among those present, not among k (inner_loop/gpu_share.py)
MEMBERS_ON_GPU_ENV = "MIRROR_ES_MEMBERS_ON_GPU"
#: every member key above (they are config keys, not metrics: the metric scan leaves them alone)
MEMBER_KEYS = (MEMBER_GPUS_KEY, MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY, MEMBERS_ON_GPU_ENV)


def share_keys(sharers: int) -> str:
    """The keys a member's GPU memory share comes from, as messages name them (its inner fraction is already the
    resources' fraction divided by the members sharing the card)."""
    if sharers > 1:
        return f"resources.{MEMBER_GPU_MEMORY_KEY} / resources.{MEMBER_GPU_SHARERS_KEY}={sharers}"
    return f"resources.{MEMBER_GPU_MEMORY_KEY}"
