"""The names of the values a training run logs and of the diagnostics a member's result record keeps.

One owner per name: the trainer appends a value under one of these keys, and the readers (the result's
diagnostics, progress.json, the inertness warning, benchmarks) look it up under the same constant, so renaming a
metric is one edit here instead of a silent miss in a reader. tests/test_metric_keys.py fails on any of these
names spelled as a string literal elsewhere in the packages or the benchmarks.

It lives in the run store because the diagnostic names are part of the result record (results/store/records.py)
and every room that logs or reads them may import it; standard library only, imports nothing.
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
