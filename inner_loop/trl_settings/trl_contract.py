"""Which of TRL GRPOTrainer's loss options our GBMPO loss honours, and the ones it refuses.

`train.trl` passes any GRPOConfig field through to TRL. Most of them act before the loss (generation, rewards,
advantages, logging) and need nothing from us. A few change what TRL's own ``_compute_loss`` computes; our
``MirrorGRPOTrainer._compute_loss`` replaces that method, so each of those is either honoured there (the vLLM
importance-sampling correction, the tool mask, ``old_per_token_logps`` None) or refused here, up front: a
setting that silently does nothing would change the experiment without a word.

No heavy imports: the config validation calls this before TRL is loaded.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: GRPOConfig fields TRL's loss reads that ours does not honour, with the value that means "off" and the advice.
#: The check is "value differs from the off value"; ``router_aux_loss_coef`` is special-cased (None and 0 pass).
_REFUSED: dict[str, tuple[Any, str]] = {
    "delta": (None, "two-sided clipping of the ratio is not part of our policy terms; pick a trust-region host "
                    "with train.policy_loss (kl3_clip, dppo_tv, spo, drpo, ...)"),
    "importance_sampling_level": ("token", "use train.policy_loss=gspo for the sequence-level ratio"),
    "top_entropy_quantile": (1.0, "the high-entropy token mask is not applied by our loss"),
    "entropy_coef": (0.0, "the entropy bonus is not added by our loss"),
    "use_adaptive_entropy": (False, "the adaptive entropy bonus is not added by our loss"),
    "off_policy_mask_threshold": (None, "the off-policy sequence mask is not applied by our loss"),
}

#: Every attribute / args field / input key TRL 1.16's ``GRPOTrainer._compute_loss`` reads, and what our loss does
#: with it. tests/test_inner_loop/grpo/test_trainer_trl_contract.py compares this with the pinned TRL's source, so a TRL bump
#: that makes its loss read something new fails a test until someone decides how our loss treats it.
REVIEWED_LOSS_INPUTS: dict[str, str] = {
    # honoured
    "use_vllm": "honoured: with vllm_importance_sampling_correction, the policy term is multiplied by the ratio",
    "vllm_importance_sampling_correction": "honoured (see use_vllm)",
    "importance_sampling_ratio": "honoured: multiplies the per-token policy term (not the regularizer, as TRL's KL)",
    "tool_mask": "honoured: mask = completion_mask * tool_mask for both terms",
    "old_per_token_logps": "honoured: None means on-policy (the detached current log-probs)",
    "epsilon_low": "honoured through PolicyParams (train.epsilon_low)",
    "epsilon_high": "honoured through PolicyParams (train.epsilon_high)",
    "loss_type": "honoured: our aggregation (train.aggregation: dr_grpo, grpo, bnpo only)",
    "max_completion_length": "honoured by the dr_grpo aggregation",
    "current_gradient_accumulation_steps": "honoured: the loss is divided by it in training",
    "advantages": "honoured", "completion_ids": "honoured", "completion_mask": "honoured",
    "prompt_ids": "honoured", "prompt_mask": "honoured",
    "model": "train/eval mode for the metrics", "accelerator": "autocast and unwrapping",
    "_metrics": "our own metrics", "_get_per_token_logps_and_entropies": "used for the sampled forms",
    # refused up front (unsupported_grpo_fields / the trainer's __init__)
    "delta": "refused", "importance_sampling_level": "refused unless 'token'",
    "top_entropy_quantile": "refused unless 1.0", "get_high_entropy_mask": "refused with top_entropy_quantile",
    "off_policy_mask_threshold": "refused", "get_off_policy_mask": "refused with off_policy_mask_threshold",
    "sampling_per_token_logps": "only read by the off-policy mask (refused)",
    "entropy_coef": "refused", "use_adaptive_entropy": "refused", "_entropy_bonus_enabled": "refused",
    "_entropy_window_stats": "entropy bonus (refused)", "_last_world_entropy": "entropy bonus (refused)",
    "entropy_coef_delta": "entropy bonus (refused)", "entropy_coef_max": "entropy bonus (refused)",
    "entropy_coef_min": "entropy bonus (refused)", "entropy_target": "entropy bonus (refused)",
    "aux_loss_enabled": "refused in the trainer (MoE router loss): set train.trl.router_aux_loss_coef=0",
    "router_aux_loss_coef": "refused unless null or 0",
    # cannot be reached: fields we own (beta = 0, loss_type from train.aggregation)
    "beta": "always 0 (ours is the regularizer)", "ref_per_token_logps": "only with beta != 0",
    "use_bias_correction_kl": "only with beta != 0",
    "sapo_temperature_neg": "loss_type sapo is not an aggregation of ours",
    "sapo_temperature_pos": "loss_type sapo is not an aggregation of ours",
    "vespo_k_neg": "loss_type vespo", "vespo_k_pos": "loss_type vespo", "vespo_lambda_neg": "loss_type vespo",
    "vespo_lambda_pos": "loss_type vespo", "get_gamma_weights": "loss_type vespo",
    "num_items_in_batch": "loss types cispo/dapo/vespo only", "steps_per_generation": "loss types cispo/dapo/vespo",
    # multimodal inputs: our tasks are text-only, the collator never produces them
    "pixel_values": "text-only", "image_grid_thw": "text-only", "num_images": "text-only",
    "pixel_attention_mask": "text-only", "spatial_shapes": "text-only", "num_tiles": "text-only",
    "image_sizes": "text-only", "token_type_ids": "text-only", "mm_token_type_ids": "text-only",
    "image_position_ids": "text-only",
}


def _value(settings: Mapping[str, Any] | Any, name: str, default: Any) -> Any:
    if isinstance(settings, Mapping):
        return settings.get(name, default)
    return getattr(settings, name, default)


def unsupported_grpo_fields(settings: Mapping[str, Any] | Any) -> list[str]:
    """One message per GRPOConfig setting our loss would silently ignore; empty when all is honoured.

    ``settings``: a GRPOConfig, or the ``train.trl`` mapping (fields absent from it keep GRPOConfig's default,
    which is always supported). Callers raise ValueError with the messages (each names ``train.trl.<field>``).
    """
    found = []
    for name, (off, advice) in _REFUSED.items():
        value = _value(settings, name, off)
        if value != off:
            found.append(f"train.trl.{name}={value!r} is not honoured by the GBMPO loss: {advice}")
    coef = _value(settings, "router_aux_loss_coef", None)
    if coef not in (None, 0, 0.0):
        found.append(f"train.trl.router_aux_loss_coef={coef!r} is not honoured by the GBMPO loss (no MoE router "
                     "loss is added); remove it, or set 0 to train a MoE model without it")
    return found
