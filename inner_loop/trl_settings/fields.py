"""Which TRL GRPOConfig field each of our keys sets: the one table of that mapping.

Read by the keyword builder (grpo/args.py: the keywords come from it, and a value TRL rejects is traced back to its
key through it) and by the `train.trl` check (trl_settings/trl_overrides.py: a field set from one of our keys is refused
there, naming the key), so the three can never name different keys for one field. Imports nothing of ours but the
generation names (inner_loop/generation/backends.py, which imports nothing).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inner_loop.generation.backends import cache_implementation


def trainer_save_total_limit(keep: str, save_total_limit: int | None) -> int | None:
    """The Trainer's ``save_total_limit`` for a policy: ``all`` keeps every checkpoint, so no rotation."""
    return None if keep == "all" else save_total_limit


@dataclass(frozen=True)
class GrpoField:
    """The GRPOConfig field one of our keys sets, and how: ``derive(value, build)`` turns the key's value into the
    field's (None: the value as it is; ``build``: grpo/args.py's view of the member). ``owned``: train.trl may not
    set the field (False: our value is only a default); ``hint``: more words for that refusal."""

    name: str
    derive: Callable[[Any, Any], Any] | None = None
    owned: bool = True
    hint: str = ""


#: Our dotted key -> the GRPOConfig field it sets.
GRPO_FIELDS: dict[str, GrpoField] = {
    "train.steps": GrpoField("max_steps"),
    # train.batch_size counts the completions of one optimizer step; with gradient accumulation a micro-batch
    # holds batch_size / k of them
    "train.batch_size": GrpoField(
        "per_device_train_batch_size", lambda size, build: size // build.accumulation,
        hint="completions per optimizer step; with train.trl.gradient_accumulation_steps=k each micro-batch holds "
             "batch_size/k"),
    "train.group_size": GrpoField("num_generations"),
    "train.num_iterations": GrpoField("num_iterations"),
    "train.learning_rate": GrpoField("learning_rate"),
    "train.lr_scheduler": GrpoField("lr_scheduler_type"),
    "train.lr_warmup_steps": GrpoField("warmup_steps"),
    "train.weight_decay": GrpoField("weight_decay"),
    "train.grad_clip": GrpoField("max_grad_norm"),
    "train.max_completion_length": GrpoField("max_completion_length"),
    "train.temperature": GrpoField("temperature"),
    "train.top_p": GrpoField("top_p"),
    # dynamic -> None (transformers' default cache); persistent_compiled's one cache and compiled step: the trainer's
    "train.decode_cache": GrpoField("cache_implementation", lambda cache, build: cache_implementation(cache)),
    "train.aggregation": GrpoField("loss_type"),
    "train.scale_rewards": GrpoField("scale_rewards", lambda scale, build: "group" if scale else "none"),
    "train.epsilon_low": GrpoField("epsilon"),
    "train.epsilon_high": GrpoField("epsilon_high"),
    "train.save_every": GrpoField("save_steps"),
    "train.save_total_limit": GrpoField(
        "save_total_limit", lambda limit, build: trainer_save_total_limit(build.cfg.train.keep_checkpoints, limit),
        hint="and train.keep_checkpoints"),
    "train.logging_steps": GrpoField("logging_steps"),
    # tensorboard is our own callback (inner_loop/training/callbacks.py) writing into the member's work dir
    "train.report_to": GrpoField("report_to", lambda names, build: [n for n in names if n != "tensorboard"]),
    # bf16 only where the member trains on a GPU; train.trl.bf16 may still override it
    "model.dtype": GrpoField("bf16", lambda dtype, build: dtype == "bfloat16" and build.gpu_member, owned=False),
}

#: GRPOConfig fields no key of ours sets: fixed by how mirror-es trains, or defaults a user may change through
#: train.trl (gradient accumulation, tqdm, completions); the refused ones are in OTHER_OWNED below.
FIXED_FIELDS: dict[str, Any] = {
    "beta": 0.0, "save_strategy": "steps", "remove_unused_columns": False, "gradient_accumulation_steps": 1,
    "disable_tqdm": True, "log_completions": False,
}

#: GRPOConfig fields train.trl may not set that no table key sets either: per run, fixed, or done our own way;
#: field -> what to use instead.
OTHER_OWNED: dict[str, str] = {
    "output_dir": "work_dir (a member's checkpoints live in <work_dir>/checkpoints)",
    "beta": "divergence=kl with divergence.coef (the regularizer toward the reference is ours; TRL's beta stays 0)",
    "save_strategy": "train.save_every (resuming a preempted member relies on checkpoints every N steps)",
    "eval_strategy": "train.eval_every (intermediate validation pass@1, written for meta.tune's pruner)",
    "eval_steps": "train.eval_every",
    "seed": "seed",
    "data_seed": "seed",
    "chat_template_kwargs": "model.chat_template_kwargs (prompts are formatted by us, identically for evaluation)",
    "remove_unused_columns": "nothing: the reward reads the dataset's problem_index column, so it stays false",
}


def owned_fields() -> dict[str, str]:
    """Every GRPOConfig field train.trl may not set -> the key (and why) to use instead."""
    owned = {entry.name: key + (f" ({entry.hint})" if entry.hint else "")
             for key, entry in GRPO_FIELDS.items() if entry.owned}
    return {**owned, **OTHER_OWNED}
