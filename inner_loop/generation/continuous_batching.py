"""transformers' continuous batching in a member: its paged cache sized from the member's memory, not the node's.

Why: unless told otherwise, TRL builds transformers' ``ContinuousBatchingConfig`` with ``max_memory_percent=0.5``,
and transformers turns that into half of the memory free when generation starts. On the CPU that is half of the
node's RAM (less this process's RSS), whatever the member was allocated, so every member sharing a node takes half
of it. And the cache is not all: with eager/SDPA attention (every CPU member) transformers preallocates attention
masks of ``max_batch_tokens x (cached tokens + max_batch_tokens)`` elements beside it. Measured here (tiny model,
23 GiB machine, 2 cores): TRL's default allocated 8,192 x ~348k float32 mask elements (~11 GiB) at every step's
generation, its set-up alone taking 41 s of the first step.

How: the member's budget is ``memory.generation_cache_bytes`` (the one owner of that number). The sizing is
transformers' own (``PagedAttentionMemoryHandler``: the cache, the batch's buffers and activation peaks, the masks),
run with that budget as the memory available; its result is written as ``num_blocks`` and ``max_batch_tokens``,
which transformers then takes as given. transformers is pinned (pyproject.toml), and these internals are checked
against it by tests/test_inner_loop/generation/test_continuous_batching.py.
"""
from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inner_loop.generation.memory import generation_cache_bytes, member_memory_bytes

if TYPE_CHECKING:  # the real imports are lazy: transformers and TRL take seconds to import
    import torch
    from transformers import ContinuousBatchingConfig, PretrainedConfig
    from trl import GRPOConfig

logger = logging.getLogger(__name__)

#: The node a member sets this through, for every message about it.
CONFIG_KEY = "train.trl.transformers_continuous_batching_config"
#: The fields that size the paged cache in transformers: set by the user, the member's budget does not apply.
SIZING_FIELDS = ("num_blocks", "max_memory_percent")
#: transformers' own max_batch_tokens when none is given (PagedAttentionMemoryHandler._default_max_batch_tokens).
DEFAULT_MAX_BATCH_TOKENS = 8192
#: The smallest max_batch_tokens tried before a budget is declared too small: prefill is chunked to it, so a smaller
#: batch still works, only with more forward passes than a CPU member should spend.
MIN_MAX_BATCH_TOKENS = 64
#: transformers' cap on max_requests_per_batch (initialization.FALLBACK_DEFAULTS), which it applies to the hint.
_MAX_REQUESTS_PER_BATCH = 1024
_MIB = 1 << 20


@dataclass(frozen=True)
class GenerationWorkload:
    """What one of TRL's ``generate_batch`` calls asks of the cache."""

    #: completions per prompt (``num_generations``): one group, the least a step can generate
    group_size: int
    #: the longest prompt, in tokens as TRL tokenizes it
    max_prompt_tokens: int
    #: ``max_completion_length``, the most tokens a completion can take
    max_completion_tokens: int
    #: completions per call (TRL's ``generation_batch_size``)
    requests: int


@dataclass(frozen=True)
class _Geometry:
    """How transformers lays the cache out for one model: whole-model blocks inside allocation sectors."""

    bytes_per_block: int
    bytes_per_sector: int
    tokens_per_sector: int
    attn_types: list[str]


def bytes_per_block(model_config: "PretrainedConfig", dtype: "torch.dtype", page_size: int) -> int:
    """Bytes of one cache block, the unit of ``num_blocks``: keys and values of ``page_size`` tokens in every layer
    (2 x layers x kv heads x head_dim x page_size x dtype size, as ``PagedAttentionCache`` counts it)."""
    from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

    return (2 * model_config.num_hidden_layers * find_num_key_value_heads(model_config) * find_head_dim(model_config)
            * page_size * dtype.itemsize)


def _geometry(model_config: "PretrainedConfig", dtype: "torch.dtype", cb: "ContinuousBatchingConfig") -> _Geometry:
    """The sector layout ``PagedAttentionCache.__init__`` computes (one allocator per attention type, sectors the
    LCM of their block sizes and 128 bytes), without allocating anything."""
    from transformers.generation.continuous_batching.cache import ATTN_TYPE_TO_ALLOCATOR, group_layers_by_attn_type
    from transformers.generation.continuous_batching.utils import find_num_key_value_heads

    groups = group_layers_by_attn_type(model_config)
    allocators = [ATTN_TYPE_TO_ALLOCATOR[kind](index=i, layer_indices=layers, config=model_config,
                                               num_key_value_heads=find_num_key_value_heads(model_config),
                                               cache_dtype=dtype, page_size=cb.page_size,
                                               allow_block_sharing=cb.allow_block_sharing)
                  for i, (kind, layers) in enumerate(groups.items())]
    sector = math.lcm(*(a.bytes_per_block for a in allocators), 128)
    tokens = max((sector // a.bytes_per_block) * a.tokens_per_page for a in allocators)
    return _Geometry(bytes_per_block(model_config, dtype, cb.page_size), sector, tokens, list(groups))


def _footprint_handler(model_config: "PretrainedConfig", dtype: "torch.dtype", cb: "ContinuousBatchingConfig",
                       geometry: _Geometry, budget_bytes: int, supports_logits_to_keep: bool) -> Any:
    """transformers' memory handler for this cache, with the member's budget as the memory it may take."""
    from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler

    class _Budgeted(PagedAttentionMemoryHandler):
        def get_available_memory(self) -> int:  # the member's budget instead of a share of the device's free memory
            return budget_bytes

    return _Budgeted(config=model_config, cb_config=cb, dtype=dtype, bytes_per_sector=geometry.bytes_per_sector,
                     tokens_per_sector=geometry.tokens_per_sector, bytes_per_block=geometry.bytes_per_block,
                     attn_types=geometry.attn_types, model_supports_logits_to_keep=supports_logits_to_keep)


def _user_config(user_config: Mapping[str, Any] | None) -> "ContinuousBatchingConfig":
    from transformers import ContinuousBatchingConfig

    try:
        return ContinuousBatchingConfig(**dict(user_config or {}))
    except TypeError as exc:  # an unknown field: name the node it came from
        raise ValueError(f"{CONFIG_KEY}: {exc} (the fields of transformers' ContinuousBatchingConfig)") from exc


def bounded_continuous_batching_config(user_config: Mapping[str, Any] | None, model_config: "PretrainedConfig",
                                       dtype: "torch.dtype", budget_bytes: int, workload: GenerationWorkload, *,
                                       supports_logits_to_keep: bool = False) -> dict[str, Any]:
    """The ``transformers_continuous_batching_config`` a member passes to TRL: the user's, with ``num_blocks`` and
    ``max_batch_tokens`` set so the paged cache and everything transformers sizes with it fit ``budget_bytes``.

    A user's ``num_blocks`` or ``max_memory_percent`` wins: the config is returned as given. A user's
    ``max_batch_tokens`` is kept; otherwise it is the call's prefill (requests x longest prompt, at most
    transformers' 8192), halved while the cache left beside it cannot hold one group. ValueError naming
    ``train.trl.transformers_continuous_batching_config`` if even one group does not fit.
    """
    user = dict(user_config or {})
    cb = _user_config(user)
    if any(user.get(name) is not None for name in SIZING_FIELDS):
        logger.info("continuous batching: %s sets %s; the member's cache budget (%d MiB) does not apply",
                    CONFIG_KEY, " and ".join(n for n in SIZING_FIELDS if user.get(n) is not None), budget_bytes // _MIB)
        return user
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    geometry = _geometry(text_config, dtype, cb)
    # What a generate_batch call resolves from its workload hints; only the logits_to_keep reservation reads it.
    requests_per_batch = cb.max_requests_per_batch or min(workload.requests, _MAX_REQUESTS_PER_BATCH)
    sequence_blocks = math.ceil((workload.max_prompt_tokens + workload.max_completion_tokens) / cb.page_size)
    group_blocks = workload.group_size * sequence_blocks
    if cb.max_batch_tokens is not None:
        candidates = [cb.max_batch_tokens]
    else:
        first = max(MIN_MAX_BATCH_TOKENS, min(DEFAULT_MAX_BATCH_TOKENS,
                                              workload.requests * workload.max_prompt_tokens))
        candidates = [first]
        while candidates[-1] // 2 >= MIN_MAX_BATCH_TOKENS:
            candidates.append(candidates[-1] // 2)
    for batch_tokens in candidates:
        sizing = copy.copy(cb)  # not dataclasses.replace: __post_init__ would repeat its deprecation warnings
        sizing.max_batch_tokens, sizing.max_requests_per_batch = batch_tokens, requests_per_batch
        handler = _footprint_handler(text_config, dtype, sizing, geometry, budget_bytes, supports_logits_to_keep)
        try:
            _, sectors = handler.infer_max_batch_tokens_and_num_sectors()
        except (ValueError, MemoryError):  # the batch's buffers alone exceed the budget
            continue
        num_blocks = sectors * geometry.bytes_per_sector // geometry.bytes_per_block
        if num_blocks < group_blocks:
            continue
        logger.info("continuous batching: paged cache of %d blocks of %d tokens (%d MiB of keys and values), "
                    "max_batch_tokens %d; %d MiB in all as transformers counts it, within the member's generation "
                    "cache budget of %d MiB", num_blocks, cb.page_size, num_blocks * geometry.bytes_per_block // _MIB,
                    batch_tokens, handler.compute_memory_footprint(batch_tokens, sectors) // _MIB,
                    budget_bytes // _MIB)
        return {**user, "num_blocks": num_blocks, "max_batch_tokens": batch_tokens}
    tried = (f"max_batch_tokens={candidates[0]}" if len(candidates) == 1
             else f"max_batch_tokens from {candidates[0]} down to {candidates[-1]}")
    raise ValueError(
        f"{CONFIG_KEY}: the member's generation cache budget of {budget_bytes // _MIB} MiB cannot hold one group's "
        f"prompt + completion tokens ({workload.group_size} x ({workload.max_prompt_tokens} + "
        f"{workload.max_completion_tokens}) tokens, {group_blocks} cache blocks of {cb.page_size} tokens at "
        f"{geometry.bytes_per_block} bytes each) beside the batch's buffers ({tried}); give the member more memory, "
        f"lower train.group_size or train.max_completion_length, or size the cache yourself with num_blocks or "
        f"max_memory_percent in {CONFIG_KEY}")


def longest_prompt_tokens(tokenizer: Any, prompts: Sequence[str]) -> int:
    """The longest of ``prompts`` in tokens, tokenized as TRL tokenizes them (special tokens included)."""
    return max(len(ids) for ids in tokenizer(text=list(prompts))["input_ids"])


def member_continuous_batching_config(args: "GRPOConfig", model: Any, tokenizer: Any, prompts: Sequence[str],
                                      gpu_budget_bytes: int | None = None) -> dict[str, Any] | None:
    """The continuous-batching config a member's trainer is built with (``args`` is its GRPOConfig, ``prompts`` its
    formatted training prompts): the paged cache bounded by the member's own memory, never by what its device has
    free. On the CPU that is its host allocation; on a GPU its GPU budget (``gpu_budget_bytes``,
    inner_loop/generation/memory.py: its share of the GPU), of which the cache takes ``generation_cache_bytes``.
    With vLLM on, TRL generates with vLLM and never reads this config.
    """
    import torch

    user = args.transformers_continuous_batching_config
    if args.use_vllm:
        return user
    allocation = gpu_budget_bytes if args.device.type != "cpu" else member_memory_bytes()
    if args.device.type != "cpu" and allocation is None:
        raise ValueError(f"continuous batching on {args.device}: the member's GPU budget is unknown")
    # The dtype the cache will have: TRL casts the model to bf16 / fp16 before generate_batch when asked to.
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else model.dtype
    workload = GenerationWorkload(
        group_size=args.num_generations,
        max_prompt_tokens=longest_prompt_tokens(tokenizer, prompts),
        max_completion_tokens=args.max_completion_length,
        requests=args.generation_batch_size)
    supports = getattr(model, "_supports_logits_to_keep", None)  # as transformers' manager reads it
    return bounded_continuous_batching_config(user, model.config, dtype, generation_cache_bytes(allocation), workload,
                                              supports_logits_to_keep=callable(supports) and bool(supports()))
