"""The policy-term registry: one string (`train.policy_loss`) picks the host of the GBMPO loss."""
from __future__ import annotations

from typing import Callable, Mapping

from inner_loop.loss.policy_terms import PolicyInputs, PolicyOutput, PolicyParams, clip_term, gspo_term
from inner_loop.loss.trust_regions import DEFAULT_SIZES, TRUST_REGION_TERMS, trust_region_size

PolicyTerm = Callable[[PolicyInputs, PolicyParams], PolicyOutput]

POLICY_TERMS: dict[str, PolicyTerm] = {
    "clip": clip_term,
    "gspo": gspo_term,
    **TRUST_REGION_TERMS,
}


def get_policy_term(name: str) -> PolicyTerm:
    """The registered host `name`, or a ValueError listing the known ones."""
    try:
        return POLICY_TERMS[name]
    except KeyError:
        raise ValueError(f"train.policy_loss={name!r} is not one of {sorted(POLICY_TERMS)}") from None


def validate_policy_extra(name: str, extra: Mapping[str, float]) -> None:
    """Check `train.policy_extra` for host `name` before any work: only its own keys, with valid values."""
    get_policy_term(name)
    allowed = DEFAULT_SIZES.get(name, {})
    unknown = sorted(set(extra) - set(allowed))
    if unknown:
        hint = f"it takes {sorted(allowed)}" if allowed else "it takes none (use epsilon_low/epsilon_high)"
        raise ValueError(f"train.policy_extra has keys {unknown} that policy_loss={name!r} does not use; {hint}")
    if name in TRUST_REGION_TERMS:
        trust_region_size(name, PolicyParams(extra=dict(extra)))
