"""A member's training diagnostics: which TRL log keys enter its result record, under which names, and how
they are summarised over the run (the mean of the finite values logged)."""
from __future__ import annotations

import math
from typing import Any

from inner_loop.loss.regularizers import GRAD_SHARE_DIAGNOSTIC

#: TRL log keys averaged over the run into the result's diagnostics.
_DIAGNOSTIC_KEYS = {
    "reward": "reward_mean",
    "frac_reward_zero_std": "zero_variance_group_frac",
    "completions/clipped_ratio": "clipped_completion_ratio",
    "regularizer/value": "regularizer_value",
    # ||grad coef*D|| / ||grad policy term||: per step in the space the loss sees, and once exactly w.r.t. the
    # trainable parameters (inner_loop/loss/grad_share.py); a ratio of gradients, since the policy term's VALUE is ~0
    "regularizer/grad_share": GRAD_SHARE_DIAGNOSTIC,
    "regularizer/grad_share_exact": "regularizer_grad_share_exact",
    "regularizer/grad_share_exact_step": "regularizer_grad_share_exact_step",
}
#: Policy-term metrics (clipping, trust-region masks, mean ratio) are kept under their own names.
_POLICY_METRIC_PREFIXES = ("clip_ratio/", "trust_region/")


def diagnostics_from_history(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over the logged steps of each diagnostic (finite values only)."""
    out: dict[str, float] = {}
    policy_keys = sorted({k for h in history for k in h if k.startswith(_POLICY_METRIC_PREFIXES)})
    for key, name in [*_DIAGNOSTIC_KEYS.items(), *((k, k) for k in policy_keys)]:
        values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
        if values:
            out[name] = sum(values) / len(values)
    return out
