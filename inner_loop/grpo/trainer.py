"""GBMPO on top of TRL: GRPOTrainer with our loss (policy term + coef * Bregman regularizer, our aggregation).

Everything else - generation, reward plumbing, advantages, checkpointing, logging - is TRL's. TRL's own KL is
switched off (beta = 0); the reference policy is the frozen initial model (a copy taken before training, or
with LoRA the base with the adapter disabled) and its log-probs / logits are computed here under no_grad.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import math
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import add_fused_lm_head, pad

from inner_loop.generation.backends import (DYNAMIC_CACHE, HF_GENERATE, OWNED_LOOP, PERSISTENT_CACHES,
                                            PERSISTENT_MERGED, VLLM_COLOCATE, cache_implementation,
                                            decode_cache_refusal, generation_backend)
from inner_loop.generation.decode_step import TRANSFORMERS_INPUT_GRAD_HOOK, PersistentDecoder
from inner_loop.generation.owned_loop import OwnedDecoder
from inner_loop.generation.sampling import importance_sampling_ratio, processed_logps
from inner_loop.generation.memory import held_gpu_bytes, member_gpu_budget_bytes
from inner_loop.generation.vllm_colocate import (claim_rendezvous_port, engine_in_policy_dtype,
                                                  set_cpu_cache_from_allocation, use_reload_push_on_cpu)
from inner_loop.loss.grad_share import exact_share, logit_space_share, logp_space_share
from inner_loop.loss.compose import compose_loss
from inner_loop.loss.policy_terms import PolicyInputs, PolicyParams
from inner_loop.loss.regularizers import FullForm, Regularizer
from inner_loop.grpo.sampler import EpochRepeatSampler
from inner_loop.grpo.step_profile import (BACKWARD, COMPUTE_LOSS, GENERATE, GRAD_CLIP, POLICY_FORWARD, PREPARE_INPUTS,
                                          REFERENCE_FORWARD, REWARD, REWARD_WAIT, TRAINING_STEP, step_range)
from inner_loop.trl_settings.trl_contract import unsupported_grpo_fields
from core.keys import (GENERATE_TIME, GRAD_SHARE, GRAD_SHARE_EXACT, GRAD_SHARE_EXACT_STEP, IMPORTANCE_SAMPLING_RATIO,
                       POLICY_LOSS, REGULARIZER_VALUE, SAMPLING_LOGP_DIFFERENCE, STEP_TIME)

logger = logging.getLogger(__name__)

#: Memory the full vocabulary may take at once beside what a step holds when train.full_form_rows is null, on the CPU
#: (and any non-CUDA device): fixed, since host memory is not ours alone to measure and take. It caps the full form's
#: tiles (mirror_maps.tiled, whose own cap is smaller) and sizes the row chunks of the no-grad logits that the vLLM
#: importance-sampling ratio compares on the processed distribution (_ratio_on_processed_distribution).
FULL_FORM_BUDGET_BYTES = 512 * 2**20
#: On CUDA the budget is this share of what the member's own GPU budget leaves beside the tensors it holds. A
#: quarter, because a logits chunk of the ratio's forward is not alone: its processed copy and the forward's own
#: activations come on top. A fixed 512 MiB would make a chunk ONE row at V=151,936 and T=256.
FULL_FORM_CUDA_FREE_FRACTION = 0.25


#: model config keys by which a model's forward transforms its LM head's output (TRL's fused head reads the same): the
#: full form's tiles project the logits from the head themselves and apply only the temperature
LOGIT_TRANSFORM_KEYS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                        "logits_scaling")
#: the batch key of the reference's per-token log-probs when they were computed beside the rewards (TRL shuffles and
#: splits it with the rest of the generation batch)
REFERENCE_LOGPS = "mirror_reference_logps"
#: the batch keys the reference's forward reads, rebuilt from the generated ids as TRL builds them
_REFERENCE_INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


def full_form_rows_for(budget_bytes: int, n_completion: int, vocab: int) -> int:
    """Batch rows whose two float32 (T, V) logit tensors fit `budget_bytes`; at least one."""
    per_row = 2 * n_completion * vocab * 4
    return max(1, budget_bytes // max(per_row, 1))


def full_form_budget_bytes(device: torch.device, gpu_budget_bytes: int | None = None) -> int:
    """Bytes the full vocabulary may take at once on `device`: a chunk of no-grad logits, or the full form's tiles.

    CUDA: a fraction of what the member's GPU budget (``gpu_budget_bytes``, inner_loop/generation/memory.py; None:
    the whole device) leaves beside the memory it holds now (``held_gpu_bytes``: its tensors, the static KV cache
    among them, and the idle part of the CUDA graph pools, which stay reserved through the backward). Memory the
    default pool keeps but does not use counts as room (it is reused before the driver is asked), so the previous
    step's chunks do not shrink the next. Never the device's free memory: members packed on one GPU would each size
    their chunks from the others' room.
    """
    if device.type != "cuda":
        return FULL_FORM_BUDGET_BYTES
    if gpu_budget_bytes is None:
        gpu_budget_bytes = member_gpu_budget_bytes(torch.cuda.get_device_properties(device).total_memory, 1.0)
    room = gpu_budget_bytes - held_gpu_bytes(device)
    return int(FULL_FORM_CUDA_FREE_FRACTION * max(room, 0))


def drop_stale_input_grad_hooks(model: torch.nn.Module) -> int:
    """Remove the input-embedding hooks that transformers' gradient checkpointing left behind; returns how many.

    Why: every ``gradient_checkpointing_enable`` registers a ``make_inputs_require_grads`` forward hook on the input
    embeddings and keeps a handle to the newest only, while ``gradient_checkpointing_disable`` removes them only for
    transformers' own PEFT integration, not for a peft ``PeftModel``. TRL toggles checkpointing around each
    generation and each no-grad log-prob pass, so with LoRA the embeddings gained two hooks a step (3,200 calls per
    forward by step 1,600), and a compiled decode step, whose guards count the hooks, recompiled at every step. The
    hooks only set ``requires_grad`` on the embeddings' output, so the live ones (the handles transformers holds)
    do the same work alone."""
    live = {handle.id for module in model.modules() for handle in getattr(module, "_require_grads_hooks", None) or []}
    dropped = 0
    for module in model.modules():
        hooks = module._forward_hooks
        for key in [k for k, fn in hooks.items()
                    if getattr(fn, "__name__", "") == TRANSFORMERS_INPUT_GRAD_HOOK and k not in live]:
            del hooks[key]
            dropped += 1
    return dropped


#: the adapter layers of each PEFT model, collected once (adapters_disabled); an entry goes with its model
_ADAPTER_LAYERS: "weakref.WeakKeyDictionary[Any, list[torch.nn.Module]]" = weakref.WeakKeyDictionary()


@contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """``model.disable_adapter()``'s effect, without its walks over the whole model at every use.

    Why: PEFT's context reads the model's adapter status (every module and parameter) and then disables and
    re-enables the adapter layers by walking every module: 41-52 ms of host time per use at Qwen3-1.7B's 2,389
    modules with LoRA r=64 (this project's 2-core CPU machine, loaded), once per step for the reference's forward;
    11-13 ms here. The layers are collected once and each is switched by PEFT's own ``enable_adapters`` (which keeps
    its ``requires_grad`` bookkeeping), each put back as it was; the forward runs the same code as under PEFT's.
    Prompt-learning and adaption-prompt adapters, which PEFT disables otherwise, keep PEFT's context."""
    config = model.peft_config[model.active_adapter]
    if config.is_prompt_learning or config.is_adaption_prompt:
        with model.disable_adapter():
            yield
        return
    layers = _ADAPTER_LAYERS.get(model)
    if layers is None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils import AuxiliaryTrainingWrapper

        layers = [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]
        _ADAPTER_LAYERS[model] = layers
    was_disabled = [bool(layer.disable_adapters) for layer in layers]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer, disabled in zip(layers, was_disabled):
            if not disabled:
                layer.enable_adapters(True)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; the run must end as `failed` instead of training on garbage."""


def _is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class MirrorGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose `_compute_loss` is GBMPO's: aggregate(policy_term + coef * D) with D from a Regularizer."""

    def __init__(
        self,
        *args: Any,
        regularizer: Regularizer,
        policy_term: str = "clip",
        policy_params: PolicyParams | None = None,
        full_form_rows: int | None = None,
        gpu_budget_bytes: int | None = None,
        decode_cache: str = DYNAMIC_CACHE,
        decode_buckets: list[int] | None = None,
        decode_compile_backend: str = "inductor",
        decode_windows: int = 1,
        score_beside_reference: bool = True,
        **kwargs: Any,
    ) -> None:
        model = kwargs.get("model", args[0] if args else None)
        grpo_args = kwargs.get("args")
        if grpo_args is not None and grpo_args.beta != 0.0:
            raise ValueError("MirrorGRPOTrainer adds its own regularizer; set beta=0 (TRL's KL would be added twice)")
        refused = unsupported_grpo_fields(grpo_args) if grpo_args is not None else []
        if refused:
            raise ValueError("; ".join(refused))
        if isinstance(model, str):
            raise ValueError("MirrorGRPOTrainer needs a loaded model (so the reference copy is the initial weights)")
        if full_form_rows is not None and full_form_rows < 1:
            raise ValueError(f"train.full_form_rows must be >= 1 or null (sized from memory), got {full_form_rows}")
        if grpo_args is not None:  # the GRPOConfig must carry the cache the record will name
            refusal = decode_cache_refusal(decode_cache, vars(grpo_args))
            if refusal is None and grpo_args.cache_implementation != cache_implementation(decode_cache):
                refusal = (f"decode_cache={decode_cache!r} needs GRPOConfig.cache_implementation="
                           f"{cache_implementation(decode_cache)!r}, got {grpo_args.cache_implementation!r}")
            if refusal:
                raise ValueError(refusal)
        #: train.decode_cache: HF generate's KV cache (inner_loop/generation/backends.py), for the result record
        self.decode_cache = decode_cache
        self.regularizer = regularizer
        self.policy_term = policy_term
        self.full_form_rows = full_form_rows
        #: the member's GPU memory budget (inner_loop/generation/memory.py); None: all of its device's
        self.gpu_budget_bytes = gpu_budget_bytes
        #: optimizer step whose first batch gets the exact (parameter-space) gradient share; None once measured
        self._exact_share_step: int | None = 1
        # Frozen reference: taken now, before any checkpoint is loaded into the policy on resume.
        self._frozen_ref = None
        if regularizer.active and not _is_peft(model):
            self._frozen_ref = copy.deepcopy(model).eval()
            self._frozen_ref.requires_grad_(False)
        #: the backend TRL generates with (inner_loop/generation/backends.py), for the result record
        self.generation_backend = generation_backend(vars(grpo_args)) if grpo_args is not None else None
        if self.generation_backend == VLLM_COLOCATE:
            set_cpu_cache_from_allocation()
            claim_rendezvous_port()
        #: sha256 over every completion's token ids this process generated, in order; a seed that reproduces
        #: its completions gives the same digest (the record keeps it with the step it started from)
        self._completions_sha256 = hashlib.sha256()
        self._digest_from_step: int | None = None
        #: wall seconds spent generating since TRL last logged a step time (GENERATE_TIME, beside it)
        self._generate_s = 0.0
        #: score the rewards on a thread of their own while the reference's forward runs (the sampled forms);
        #: False: the reference's forward runs in the loss, after the rewards (the same figures, bit for bit)
        self.score_beside_reference = score_beside_reference
        #: generation batches whose reference log-probs were computed beside their rewards
        self.references_beside_rewards = 0
        self._generated_prompt_ids: list[list[int]] | None = None
        self._early_reference: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        if self.generation_backend == VLLM_COLOCATE:
            with engine_in_policy_dtype(next(model.parameters()).dtype):
                super().__init__(*args, **kwargs)
        else:
            super().__init__(*args, **kwargs)
        if self.generation_backend == VLLM_COLOCATE:
            use_reload_push_on_cpu(self.vllm_generation, is_peft=_is_peft(self.model))
            # vLLM's worker seeded this process's RNGs with TRL's engine seed (the same for every member):
            # back to the member's seed, so that its sampling depends on it as with the other backends.
            from transformers import set_seed

            set_seed(self.args.seed)
        #: persistent_compiled: the member's one static cache and compiled decode step (generation/decode_step.py)
        #: owned_loop: the project's own decode loop over such a cache (generation/owned_loop.py)
        self.decoder: PersistentDecoder | OwnedDecoder | None = None
        if decode_cache in PERSISTENT_CACHES and self.generation_backend == HF_GENERATE:
            decoder_kwargs = dict(batch_size=self.args.per_device_train_batch_size * self.args.steps_per_generation,
                                  max_new_tokens=self.max_completion_length, generation_config=self.generation_config,
                                  compile_backend=decode_compile_backend)
            unwrapped = self.accelerator.unwrap_model(self.model)
            self.decoder = (OwnedDecoder(unwrapped, decode_buckets or [], **decoder_kwargs, windows=decode_windows)
                            if decode_cache == OWNED_LOOP
                            else PersistentDecoder(unwrapped, decode_buckets or [], **decoder_kwargs,
                                                   merge_lora=decode_cache == PERSISTENT_MERGED))
        self._name_backward()
        if self.aux_loss_enabled:
            raise ValueError(
                f"{type(self.model).__name__} is a Mixture-of-Experts model whose router load-balancing loss TRL adds "
                "and the GBMPO loss does not; set train.trl.router_aux_loss_coef=0 to train it without that loss"
            )
        self.policy_params = policy_params or PolicyParams(self.epsilon_low, self.epsilon_high)
        if self._frozen_ref is not None:
            add_fused_lm_head(self._frozen_ref, temperature=self.temperature)
            self._frozen_ref.to(self.accelerator.device)
        # A neural mirror map is a module built on the CPU; on a GPU the divergence meets CUDA log-probs.
        if isinstance(regularizer.potential, torch.nn.Module):
            regularizer.potential.to(self.accelerator.device)
        logger.info("GBMPO loss: %s + %s, aggregation %s", policy_term, regularizer.describe(), self.loss_type)

    def _get_train_sampler(self, dataset: Any = None) -> EpochRepeatSampler:
        """TRL's sampler with each epoch's order a function of (seed, epoch) (inner_loop/grpo/sampler.py): a run
        resumed in any epoch sees the batches the uninterrupted run saw."""
        return EpochRepeatSampler.like(super()._get_train_sampler(dataset))

    def _name_backward(self) -> None:
        """The backward transformers runs through the accelerator, as a named range of a profile (nothing else)."""
        backward = self.accelerator.backward

        def named_backward(loss: torch.Tensor, **kwargs: Any) -> Any:
            with step_range(BACKWARD):
                return backward(loss, **kwargs)

        self.accelerator.backward = named_backward

    def _clip_grad_norm(self, model: torch.nn.Module) -> Any:
        with step_range(GRAD_CLIP):
            return super()._clip_grad_norm(model)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        """TRL's: generation and scoring, shuffle and split; the range's own time in a profile is TRL's bookkeeping."""
        with step_range(PREPARE_INPUTS):
            return super()._prepare_inputs(generation_batch)

    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self._digest_from_step is None:
            self._digest_from_step = self.state.global_step
        self._generated_prompt_ids = self._early_reference = None
        # before every generation, whatever the backend: else a compiled decode step's guards fail at every step
        drop_stale_input_grad_hooks(self.accelerator.unwrap_model(self.model))
        output = super()._generate_and_score_completions(*args, **kwargs)
        self._attach_early_reference(output)
        if self.use_vllm and self.vllm_importance_sampling_correction and self._sampling_truncates():
            self._ratio_on_processed_distribution(output)
        ids, mask = output["completion_ids"], output["completion_mask"].bool()
        for row, keep in zip(ids.tolist(), mask.tolist()):
            self._completions_sha256.update(repr([t for t, k in zip(row, keep) if k]).encode())
        return output

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's generation (any backend), timed: a training generation's wall seconds go into the step's
        GENERATE_TIME (an evaluation's are not the step's). The prompts' ids are kept for the reference's forward
        beside the rewards."""
        began, training = time.perf_counter(), self.model.training
        try:
            with step_range(GENERATE):
                out = super()._generate(*args, **kwargs)
            self._generated_prompt_ids = out[0]
            return out
        finally:  # the completions came back as lists: on a GPU the decode has finished by now
            if training:
                self._generate_s += time.perf_counter() - began

    def _calculate_rewards(self, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any],
                           completion_ids_list: list[list[int]]) -> torch.Tensor:
        """TRL's rewards. Where the loss needs the reference's log-probs (the sampled forms), they are computed on
        this thread while the rewards are scored on another: the sandbox's grading waits on its processes and the
        forward on the device, so the step pays the longer of the two instead of their sum. The rewards, the
        reference's log-probs and every random stream are those of the sequential order (the reference's forward
        draws nothing, the scoring touches no torch generator)."""
        score = super()._calculate_rewards
        batch = self._reference_batch(inputs, completion_ids_list)
        if batch is None:
            with step_range(REWARD):
                return score(inputs, prompts, completions, completion_ids_list)
        with ThreadPoolExecutor(1, thread_name_prefix="mirror-es-rewards") as pool:
            future = pool.submit(_named(REWARD, score), inputs, prompts, completions, completion_ids_list)
            try:
                with step_range(REFERENCE_FORWARD):
                    logps = self._reference_logps(batch)
            except BaseException:
                _wait_quietly(future)
                raise
            with step_range(REWARD_WAIT):
                rewards = future.result()
        self._early_reference = (batch, logps)
        return rewards

    def _reference_batch(self, inputs: list[dict[str, Any]],
                         completion_ids_list: list[list[int]]) -> dict[str, torch.Tensor] | None:
        """The tensors TRL's loss batch will hold for the reference's forward, built from the generated ids as TRL
        builds them (padding, ``mask_truncated_completions``); None where the reference is not scored beside the
        rewards (the switch off, no regularizer, the full form, multimodal inputs)."""
        prompt_ids_list, self._generated_prompt_ids = self._generated_prompt_ids, None
        reg = self.regularizer
        if (not self.score_beside_reference or not reg.active or reg.needs_full_vocabulary or prompt_ids_list is None
                or not inputs or "image" in inputs[0] or "images" in inputs[0]):
            return None
        device, pad_id = self.accelerator.device, self._tokenizer.pad_token_id

        def padded(rows: list[torch.Tensor], value: int, side: str) -> torch.Tensor:
            return pad(rows, padding_value=value, padding_side=side,
                       pad_to_multiple_of=self.pad_to_multiple_of).to(device=device)

        prompts = [torch.tensor(ids) for ids in prompt_ids_list]
        completions = [torch.tensor(ids) for ids in completion_ids_list]
        completion_mask = padded([torch.ones_like(ids, dtype=torch.long) for ids in completions], 0, "right")
        if self.mask_truncated_completions:
            eos_and_pad = [*self.eos_token_ids, pad_id]
            is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids_list], device=device)
            completion_mask = completion_mask * (~is_truncated).unsqueeze(1).int()
        return {"prompt_ids": padded(prompts, pad_id, "left"),
                "prompt_mask": padded([torch.ones_like(ids, dtype=torch.long) for ids in prompts], 0, "left"),
                "completion_ids": padded(completions, pad_id, "right"), "completion_mask": completion_mask}

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reference's per-token log-probs of ``batch``, in chunks of the loss's micro-batch rows (the rows the
        loss would run it on, so the figures are the same)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        rows = (self.args.per_device_train_batch_size if self.model.training
                else self.args.per_device_eval_batch_size)
        with torch.no_grad(), self._reference(self.model) as ref:
            logps, _, _ = self._get_per_token_logps_and_entropies(ref, input_ids, attention_mask,
                                                                  batch["completion_ids"].size(1), batch_size=rows)
        return logps

    def _attach_early_reference(self, output: dict[str, Any]) -> None:
        """Put the reference's log-probs computed beside the rewards into TRL's batch, where they were computed for
        that batch's very tensors (else the loss computes them, and a warning says why)."""
        early, self._early_reference = self._early_reference, None
        if early is None:
            return
        batch, logps = early
        if all(torch.equal(batch[key], output[key]) for key in _REFERENCE_INPUTS):
            output[REFERENCE_LOGPS] = logps
            self.references_beside_rewards += 1
        else:
            logger.warning("the reference's log-probs computed beside the rewards were for other tensors than TRL's "
                           "batch (a TRL change in how it pads?): the loss computes them itself")

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """TRL's step; where it logged the step's time, the seconds the step spent generating are logged beside it
        (GENERATE_TIME), so a record says how much of its step time is decoding."""
        train = self._metrics["train"]
        logged = len(train[STEP_TIME])
        with step_range(TRAINING_STEP):
            out = super().training_step(*args, **kwargs)
        if len(train[STEP_TIME]) > logged:
            train[GENERATE_TIME].append(self._generate_s)
            self._generate_s = 0.0
        return out

    @contextmanager
    def _master_weights_kept(self) -> Iterator[None]:
        """Keep the trained weights in their own dtype across TRL's continuous-batching generation.

        Why: with ``use_transformers_continuous_batching`` and bf16 (or fp16), TRL 1.16 casts the whole policy with
        ``model.to(torch.bfloat16)`` before every generation, in place, on the Parameter objects the optimizer holds:
        the float32 LoRA weights (and Adam's state built from them) would train in bf16 from then on, where an
        update of lr 1e-5 rounds away. The cast copies are what generation uses; afterwards each parameter and
        buffer whose dtype the cast changed gets its own tensor back (references kept, nothing copied)."""
        if not (self.use_transformers_continuous_batching and (self.args.bf16 or self.args.fp16)):
            yield
            return
        model = self.accelerator.unwrap_model(self.model)
        params = [(param, param.data) for param in model.parameters()]
        buffers = [(module, name, buffer) for module in model.modules()
                   for name, buffer in module._buffers.items() if buffer is not None]
        try:
            yield
        finally:
            restored = 0
            for param, data in params:
                if param.dtype != data.dtype:
                    param.data = data
                    restored += 1
            for module, name, buffer in buffers:
                current = module._buffers.get(name)
                if current is not None and current.dtype != buffer.dtype:
                    module._buffers[name] = buffer
            if restored:
                logger.debug("restored %d parameter(s) to their dtype after continuous batching's cast", restored)

    def _sampling_truncates(self) -> bool:
        return self.top_p < 1.0 or (self.top_k is not None and self.top_k > 0)

    def _ratio_on_processed_distribution(self, output: dict[str, Any]) -> None:
        """Replace TRL's vLLM importance-sampling ratio by the one compared on the distribution vLLM sampled from:
        the policy's logits through the same top_k / top_p as vLLM's ``processed_logprobs``
        (inner_loop/generation/sampling.py says why), and correct the step's logged ratio and log-prob difference
        with it. One more no-grad forward of the batch, in chunks of rows sized like the full form's."""
        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        completion_mask, tool_mask = output["completion_mask"], output.get("tool_mask")
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], completion_mask], dim=1)
        n_completion = completion_ids.size(1)
        rows = self._full_form_rows(n_completion)
        parts = []
        with torch.no_grad():
            for start in range(0, input_ids.size(0), rows):
                piece = slice(start, start + rows)
                logits = self._completion_logits(self.model, input_ids[piece], attention_mask[piece], n_completion)
                parts.append(processed_logps(logits, completion_ids[piece], self.top_p, self.top_k))
                del logits
        policy = torch.cat(parts)
        sampler = output["sampling_per_token_logps"]
        mask = (completion_mask if tool_mask is None else completion_mask * tool_mask).float()
        ratio = importance_sampling_ratio(policy, sampler, mask, self.vllm_importance_sampling_mode,
                                          self.vllm_importance_sampling_clip_min,
                                          self.vllm_importance_sampling_clip_max)
        output["importance_sampling_ratio"] = ratio
        flat = ratio.flatten() if ratio.size(-1) == 1 else ratio[mask.bool()]
        delta = torch.abs(policy - sampler)[mask.bool()]
        delta = delta[~torch.isnan(delta)]
        metrics = self._metrics["train" if self.model.training else "eval"]
        for key, value in (("sampling/importance_sampling_ratio/min", flat.min() if flat.numel() else None),
                           (IMPORTANCE_SAMPLING_RATIO, flat.mean() if flat.numel() else None),
                           ("sampling/importance_sampling_ratio/max", flat.max() if flat.numel() else None),
                           (SAMPLING_LOGP_DIFFERENCE, delta.mean() if delta.numel() else None),
                           ("sampling/sampling_logp_difference/max", delta.max() if delta.numel() else None)):
            if value is not None and metrics[key]:
                metrics[key][-1] = value.item()  # TRL's value for this batch, compared on the full vocabulary

    def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: dict[str, Any],
                              num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], None]:
        """TRL's HF-generate branch, decoding over the member's one static cache (train.decode_cache=
        persistent_compiled); every other cache and backend is TRL's own. Overridden here, not patched in TRL:
        TRL's branch passes no cache to ``generate``, so transformers would make a new one at every call."""
        if self.decoder is None:
            with self._master_weights_kept():  # continuous batching's in-place bf16 cast undone afterwards
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
        if images is not None or multimodal_fields:
            raise ValueError(f"train.decode_cache={self.decode_cache} decodes text prompts only; use dynamic for a "
                             "multimodal model")
        device = self.accelerator.device
        pad_id = self._tokenizer.pad_token_id
        longest = max(len(ids) for ids in prompt_ids)
        input_ids = torch.tensor([[pad_id] * (longest - len(ids)) + list(ids) for ids in prompt_ids], device=device)
        attention_mask = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for ids in prompt_ids],
                                      device=device)
        with (
            profiling_context(self, "transformers.generate"),
            unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                        gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                        generation_kwargs=self.generation_kwargs,
                                        gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs
                                        ) as unwrapped_model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            completion_ids = self.decoder.generate(unwrapped_model, input_ids, attention_mask)
        # as TRL: everything after the first EOS is masked off
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=completion_ids.device))
        first_eos = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long, device=completion_ids.device)
        has_eos = is_eos.any(dim=1)
        first_eos[has_eos] = is_eos.int().argmax(dim=1)[has_eos]
        keep = torch.arange(is_eos.size(1), device=completion_ids.device)[None, :] <= first_eos[:, None]
        return [c[m].tolist() for c, m in zip(completion_ids.cpu(), keep.cpu(), strict=True)], None

    def generation_summary(self) -> dict[str, Any]:
        """What the result record says about generation: the backend, and the digest of the completions this
        process generated with the step it started from (a resumed run's digest covers the steps since its restart;
        two runs of one seed with equal digests reproduced each other's completions). ``decode_cache``: HF generate's
        KV cache (None with another backend), so a search that mixes caches shows it."""
        return {"backend": self.generation_backend,
                "decode_cache": self.decode_cache if self.generation_backend == HF_GENERATE else None,
                "decode_counts": self.decoder.summary() if self.decoder is not None else None,
                "completions_sha256": self._completions_sha256.hexdigest(),
                "from_step": self._digest_from_step}

    @contextmanager
    def _reference(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The module that computes the reference policy: the frozen copy, or the policy with LoRA disabled."""
        if self._frozen_ref is not None:
            yield self._frozen_ref
            return
        unwrapped = self.accelerator.unwrap_model(model)
        with adapters_disabled(unwrapped):
            yield model

    def _completion_logits(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           n_completion: int) -> torch.Tensor:
        """(B, T, V) temperature-scaled logits predicting each completion token (the vLLM ratio's no-grad forward)."""
        with self.accelerator.autocast():  # same precision as TRL's own log-prob forward
            out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=n_completion + 1)
        return out.logits[:, :-1, :].float() / self.temperature

    def _completion_hidden(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           n_completion: int) -> tuple[torch.Tensor, torch.nn.Module, torch.dtype]:
        """The (B, T, H) final hidden states that predict each completion token, the LM head they go through and the
        dtype its projection runs in (the autocast TRL's own log-prob forward uses; float32 with
        cast_lm_head_to_fp32). The backbone alone runs (as TRL's fused LM head runs it), so no logits are made."""
        causal_lm = self.accelerator.unwrap_model(model)
        if _is_peft(causal_lm):
            causal_lm = causal_lm.get_base_model()  # its modules carry the adapter (or not, under disable_adapter)
        head = causal_lm.get_output_embeddings()
        config = causal_lm.config.get_text_config()
        transforms = {key: getattr(config, key) for key in LOGIT_TRANSFORM_KEYS
                      if getattr(config, key, None) not in (None, 1, 1.0)}
        if transforms:
            raise ValueError(f"divergence.form=full projects the logits from the LM head itself, with the temperature "
                             f"only; {type(causal_lm).__name__} transforms them ({transforms}): use "
                             "divergence.form=sampled or sampled_is with this model")
        with self.accelerator.autocast():
            out = causal_lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            device_type = head.weight.device.type
            dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
                     else head.weight.dtype)
        if getattr(self.args, "cast_lm_head_to_fp32", False):
            dtype = torch.float32
        hidden = out.last_hidden_state[:, -(n_completion + 1):-1, :].to(head.weight.device)
        return hidden, head, dtype

    def _full_form_rows(self, n_completion: int) -> int:
        """Batch rows per chunk of the vLLM ratio's no-grad logits: the two logit tensors of a chunk fit the budget."""
        if self.full_form_rows is not None:
            return self.full_form_rows
        vocab = self.accelerator.unwrap_model(self.model).config.get_text_config().vocab_size
        budget = full_form_budget_bytes(self.accelerator.device, self.gpu_budget_bytes)
        return full_form_rows_for(budget, n_completion, vocab)

    def _full_form(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_ids: torch.Tensor, with_norms: bool) -> FullForm:
        """Sampled-token log-probs and the full-vocabulary divergence, (B, T) each, and with ``with_norms`` the
        per-token logit-space gradient norms of the gradient share: from both models' hidden states through their
        LM heads, a tile of the vocabulary at a time (mirror_maps.tiled), so neither model's (B, T, V) logits exist.
        Tiles take at most the member's full-form budget; train.full_form_rows (batch rows) fixes their positions."""
        n_completion = completion_ids.size(1)
        with step_range(POLICY_FORWARD):
            hidden, head, dtype = self._completion_hidden(model, input_ids, attention_mask, n_completion)
        with step_range(REFERENCE_FORWARD), torch.no_grad(), self._reference(model) as ref:
            ref_hidden, ref_head, _ = self._completion_hidden(ref, input_ids, attention_mask, n_completion)
        rows = None if self.full_form_rows is None else self.full_form_rows * n_completion
        return self.regularizer.full_from_hidden(
            hidden, head, ref_hidden, ref_head, completion_ids, temperature=self.temperature, compute_dtype=dtype,
            rows=rows, workspace_bytes=full_form_budget_bytes(self.accelerator.device, self.gpu_budget_bytes),
            with_norms=with_norms)

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """GBMPO's loss on TRL's batch, honouring what TRL's own loss honours (trl_loss_contract.py): the tool mask,
        ``old_per_token_logps`` None (on-policy) and, with vLLM generation, the importance-sampling ratio. The
        reference's log-probs are the batch's where they were computed beside the rewards."""
        with step_range(COMPUTE_LOSS):
            return self._gbmpo_loss(model, inputs)

    def _gbmpo_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        n_completion = completion_ids.size(1)
        tool_mask = inputs.get("tool_mask")  # tokens a tool produced are not the policy's: no loss on them
        mask = (completion_mask if tool_mask is None else completion_mask * tool_mask).float()
        reg = self.regularizer
        mode = "train" if self.model.training else "eval"
        share_wanted = reg.active and reg.coef != 0.0 and mode == "train" and torch.is_grad_enabled()

        ref_logps = None
        divergence: torch.Tensor | None = None
        norms: tuple[torch.Tensor, torch.Tensor] | None = None
        if reg.needs_full_vocabulary:
            full = self._full_form(model, input_ids, attention_mask, completion_ids, with_norms=share_wanted)
            logps, divergence = full.logps, full.divergence
            norms = None if full.policy_norms is None else (full.policy_norms, full.divergence_norms)
        else:
            with step_range(POLICY_FORWARD):
                logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, n_completion)
            ref_logps = inputs.get(REFERENCE_LOGPS) if reg.active else None  # computed beside the rewards
            if reg.active and ref_logps is None:
                with step_range(REFERENCE_FORWARD), torch.no_grad(), self._reference(model) as ref:
                    ref_logps, _, _ = self._get_per_token_logps_and_entropies(
                        ref, input_ids, attention_mask, n_completion
                    )

        old = inputs.get("old_per_token_logps")
        policy_inputs = PolicyInputs(
            logps=logps,
            old_logps=logps.detach() if old is None else old,
            advantages=inputs["advantages"],
            mask=mask,
        )
        if divergence is None and reg.active:
            divergence = reg.per_token(logps, ref_logps)
        # TRL's condition, so the same flag turns the correction on in both losses (vespo is not ours to mirror).
        is_ratio = inputs["importance_sampling_ratio"] if (
            self.use_vllm and self.vllm_importance_sampling_correction) else None
        parts = compose_loss(policy_inputs, self.policy_params, self.policy_term, divergence, reg.coef,
                             self.loss_type, self.max_completion_length, policy_weight=is_ratio)
        if not torch.isfinite(parts.loss):
            raise NonFiniteLossError(
                f"non-finite loss at step {self.state.global_step} (policy {parts.policy_loss}, "
                f"regularizer {parts.regularizer_value}); lower the learning rate or divergence.coef"
            )
        metrics = self._metrics[mode]
        metrics[POLICY_LOSS].append(parts.policy_loss)
        if reg.active:
            metrics[REGULARIZER_VALUE].append(parts.regularizer_value)
        if share_wanted and parts.regularizer_term is not None:
            self._log_grad_share(model, parts.policy_term, parts.regularizer_term, logps, divergence, norms)
        for key, value in parts.metrics.items():
            metrics[key].append(value)
        # Set by Trainer's loop; outside it (direct calls) no accumulation is in progress.
        accumulation = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        scale = accumulation if mode == "train" else 1.0
        return parts.loss / scale

    def _log_grad_share(self, model: torch.nn.Module, policy_term: torch.Tensor, regularizer_term: torch.Tensor,
                        logps: torch.Tensor, divergence: torch.Tensor,
                        norms: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Log ||grad coef*D term|| / ||grad policy term||: per batch in the space the loss sees (log-probs, or logits
        for the full form, whose tiles give the per-token norms; cheap), and once per run exactly w.r.t. the trainable
        parameters (two extra backward passes, the full form's through the same tiles) on the first batch of optimizer step ``_exact_share_step`` (1: at step 0 the policy IS the
        reference, where every divergence we offer has zero gradient, so the share there is 0 by construction)."""
        metrics = self._metrics["train"]
        if norms is None:
            share = logp_space_share(policy_term, regularizer_term, logps)
        else:  # the full form's per-token norms, from its tiles
            share = logit_space_share(policy_term, regularizer_term, logps, divergence, *norms)
        metrics[GRAD_SHARE].append(share)
        if self._exact_share_step is not None and self.state.global_step >= self._exact_share_step:
            params = [p for p in model.parameters() if p.requires_grad]
            exact = exact_share(policy_term, regularizer_term, params)
            # NaN: no policy gradient in this batch (all groups tied). 0: the policy is still the reference (every
            # earlier batch was tied, so nothing moved it), where every divergence has zero gradient. Neither says
            # anything about the coefficient: try the next batch.
            if math.isnan(exact) or exact == 0.0:
                return
            metrics[GRAD_SHARE_EXACT].append(exact)
            metrics[GRAD_SHARE_EXACT_STEP].append(float(self.state.global_step))
            logger.info("regularizer gradient share at step %d: exact %.4g (per-step estimate %.4g)",
                        self.state.global_step, exact, share)
            self._exact_share_step = None


def _named(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` inside the named range ``name`` (for a profile; nothing otherwise)."""
    def run(*args: Any) -> Any:
        with step_range(name):
            return fn(*args)
    return run


def _wait_quietly(future: Future) -> None:
    """Wait for ``future`` to end, its outcome dropped (the caller is already failing with its own error)."""
    try:
        future.result()
    except BaseException:
        logger.debug("the rewards' thread failed too, after the reference's forward did", exc_info=True)
