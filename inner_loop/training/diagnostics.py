"""A member's training diagnostics: which TRL log keys enter its result record, under which names, and how
they are summarised over the run (the mean of the finite values logged)."""
from __future__ import annotations

import math
from typing import Any

import core.keys as keys

#: TRL log keys averaged over the run into the result's diagnostics.
_DIAGNOSTIC_KEYS = {
    keys.REWARD: keys.REWARD_MEAN,
    keys.FRAC_REWARD_ZERO_STD: keys.ZERO_VARIANCE_GROUP_FRAC,
    keys.COMPLETIONS_CLIPPED_RATIO: keys.CLIPPED_COMPLETION_RATIO,
    keys.REGULARIZER_VALUE: keys.REGULARIZER_VALUE_MEAN,
    # ||grad coef*D|| / ||grad policy term||: per step in the space the loss sees, and once exactly w.r.t. the
    # trainable parameters (inner_loop/loss/grad_share.py); a ratio of gradients, since the policy term's VALUE is ~0
    keys.GRAD_SHARE: keys.GRAD_SHARE_DIAGNOSTIC,
    keys.GRAD_SHARE_EXACT: keys.GRAD_SHARE_EXACT_DIAGNOSTIC,
    keys.GRAD_SHARE_EXACT_STEP: keys.GRAD_SHARE_EXACT_STEP_DIAGNOSTIC,
    keys.STEP_TIME: keys.STEP_TIME_MEAN,
    keys.GENERATE_TIME: keys.GENERATE_TIME_MEAN,  # the step's generation, beside it
    # vLLM only: how far the sampler's log-probs were from the trained policy's, and the correction applied
    keys.SAMPLING_LOGP_DIFFERENCE: keys.SAMPLING_LOGP_DIFFERENCE_MEAN,
    keys.IMPORTANCE_SAMPLING_RATIO: keys.IMPORTANCE_SAMPLING_RATIO_MEAN,
}
#: Policy-term metrics (clipping, trust-region masks, mean ratio) are kept under their own names.
_POLICY_METRIC_PREFIXES = keys.POLICY_METRIC_PREFIXES


def diagnostics_from_history(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over the logged steps of each diagnostic (finite values only)."""
    out: dict[str, float] = {}
    policy_keys = sorted({k for h in history for k in h if k.startswith(_POLICY_METRIC_PREFIXES)})
    for key, name in [*_DIAGNOSTIC_KEYS.items(), *((k, k) for k in policy_keys)]:
        values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
        if values:
            out[name] = sum(values) / len(values)
    return out
