"""A member's share of the card: the memory limit it trains under, its turn to start a vLLM engine, and what its
record says when it runs out of memory.

Why: with resources.members_per_gpu = k >= 2, k members train on one GPU, each promised a share of its memory
(resources.gpu_memory_fraction / k, carried in the inner config already divided). Sizing the caches from the share
(inner_loop/generation/memory.py) is not enough: the policy, its optimizer and the activations grow where they
will, and a member that took more than its share would make a neighbour fail instead of itself. So the member
caps torch's allocator at its share (a colocated vLLM engine allocates through the same allocator), and a member
that exceeds it fails alone, with a record that names the share, not the neighbour's.
"""
from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping

from inner_loop.generation.backends import VLLM_COLOCATE
from inner_loop.generation.engine_start import engine_start_turn
from inner_loop.generation.memory import private_pool_bytes
from core.keys import MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY, MEMBERS_ON_GPU_ENV, share_keys

logger = logging.getLogger(__name__)

_GIB = 1 << 30
#: what vLLM raises, as a ValueError, when its engine cannot get its memory at start-up (v1: the free-memory check
#: of ``request_memory``, then ``_check_enough_kv_cache_memory``), each with what to change
VLLM_MEMORY_ERRORS = {
    "less than desired GPU memory utilization": "lower train.trl.vllm_gpu_memory_utilization",
    "No available memory for the cache blocks": "raise train.trl.vllm_gpu_memory_utilization (within the share)",
    "larger than the available KV cache memory": "raise train.trl.vllm_gpu_memory_utilization (within the share) "
                                                 "or lower train.max_completion_length",
}
#: what to change when torch's allocator ran out within the share
TORCH_MEMORY_FIX = "lower train.batch_size or train.max_completion_length"
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
#: frames of the traceback kept in a record's error (the full traceback is in the member's log)
TRACEBACK_FRAMES = 3
#: GPU memory each member process uses outside torch's allocator, which the cap does not count (the CUDA context,
#: cuBLAS/cuDNN workspaces, NCCL): measured 835 MiB on an H100 (scripts/gpu_pass.py, docs/benchmarks.md: 13,703 MiB
#: of device use against 12,868 MiB reserved by torch), rounded up. k members' caps leave k of these free
CONTEXT_ALLOWANCE_BYTES = 1 << 30
#: the record's key for the fraction torch's allocator was capped at (the share less the context allowance)
CAP_KEY = "gpu_memory_cap_fraction"
#: the record's key for the other members the card was shared with (from gpu_share.json)
PARTNERS_KEY = "shared_with"


def members_present(sharers: int) -> int:
    """How many members share the card now: members_per_gpu, or fewer where the packed task started fewer (the odd
    member of a generation, a requeued task's survivors; MEMBERS_ON_GPU_ENV)."""
    try:
        present = int(os.environ.get(MEMBERS_ON_GPU_ENV, sharers))
    except ValueError:
        return sharers
    return max(1, min(sharers, present))


def apply_memory_share(device: Mapping[str, Any], fraction: float, sharers: int,
                       partners: list[int] | None = None) -> dict[str, Any]:
    """On CUDA, cap this process's torch allocations at its share of its GPU and return ``device`` (inner_loop/
    member/device.py's record of it) with the share, the cap, the members sharing the card and ``partners`` (their
    indices); elsewhere ``device`` unchanged. Call it before the model loads: the cap applies to allocations made
    after it.

    ``fraction`` is the share among ``sharers`` members (resources.gpu_memory_fraction / k). Where fewer are present
    (members_present), the card is divided among those; a member alone gets the configured fraction whole. With two
    or more on the card, the cap leaves CONTEXT_ALLOWANCE_BYTES of the share to the process's CUDA context, which
    torch's cap does not count: k caps plus k contexts fit the card."""
    info = dict(device)
    if info.get("type") != "cuda":
        return info
    present = members_present(sharers)
    if present < sharers:
        logger.info("GPU memory: %d of the card's %d members present: this member's share is 1/%d of the card's "
                    "%.3g", present, sharers, present, fraction * sharers)
        fraction, sharers = fraction * sharers / present, present
    total = info.get("memory_bytes") or 0
    cap = fraction - (CONTEXT_ALLOWANCE_BYTES / total if sharers >= 2 and total else 0.0)
    if cap <= 0:
        raise ValueError(f"resources.members_per_gpu={sharers}: a share of {fraction:.3g} of {total / _GIB:.1f} GiB "
                         f"leaves nothing beside each process's CUDA context ({CONTEXT_ALLOWANCE_BYTES / _GIB:g} GiB)")
    if cap < 1:
        import torch

        index = torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(cap, index)
        logger.info("GPU memory: this member may allocate %.3g of cuda:%d (%s), %.1f GiB (%s%s)", cap, index,
                    info.get("name"), total * cap / _GIB, share_keys(sharers),
                    f", less {CONTEXT_ALLOWANCE_BYTES / _GIB:g} GiB for its CUDA context" if cap < fraction else "")
    info.update({MEMBER_GPU_MEMORY_KEY: fraction, MEMBER_GPU_SHARERS_KEY: sharers})
    if cap < fraction:
        info[CAP_KEY] = cap
    if partners:
        info[PARTNERS_KEY] = sorted(partners)
    return info


def card_use_text(device: Mapping[str, Any]) -> str:
    """What the card holds as a whole when a member runs out of memory: its use (all processes, from the driver)
    and the members on it, so that one member's failure names its neighbours."""
    parts = []
    try:
        import torch

        free, total = torch.cuda.mem_get_info()
        parts.append(f"the card had {(total - free) / _GIB:.1f} of {total / _GIB:.1f} GiB in use")
        # this member's part: its allocator's hold, the static KV cache and the CUDA graphs' pools (kept reserved
        # through the backward) within it
        held, pools = torch.cuda.memory_reserved(), private_pool_bytes(torch.cuda.memory_snapshot())[0]
        if held:
            parts[-1] += f", this member {held / _GIB:.1f} GiB" + (
                f" ({pools / _GIB:.1f} in CUDA graph pools)" if pools else "")
    except Exception:  # the context itself may be what failed; the record keeps the rest
        pass
    partners = device.get(PARTNERS_KEY)
    if partners:
        parts.append("members on it: this one and " + ", ".join(str(p) for p in partners))
    return "; ".join(parts)


def share_text(device: Mapping[str, Any]) -> str:
    """'0.50 of NVIDIA H100 80GB HBM3 (79.2 GiB) = 39.6 GiB (resources.gpu_memory_fraction /
    resources.members_per_gpu=2)': a member's share as its record states it."""
    fraction = float(device.get(MEMBER_GPU_MEMORY_KEY) or 1.0)
    sharers = int(device.get(MEMBER_GPU_SHARERS_KEY) or 1)
    total = device.get("memory_bytes")
    card = f"{device.get('name') or 'its GPU'}" + (f" ({total / _GIB:.1f} GiB) = {total * fraction / _GIB:.1f} GiB"
                                                   if total else "")
    return f"{fraction:.2f} of {card} ({share_keys(sharers)})"


def _memory_fix(exc: BaseException) -> str | None:
    """What to change when ``exc`` is the GPU running out of memory (torch's OutOfMemoryError, or vLLM's refusal to
    start its engine for want of memory); None when it is another error."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return TORCH_MEMORY_FIX
    if isinstance(exc, ValueError):
        return next((fix for text, fix in VLLM_MEMORY_ERRORS.items() if text in str(exc)), None)
    return None


def _traceback_tail(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback, innermost last: 'file:line in function <- ...'."""
    frames = traceback.extract_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))


def _short(filename: str) -> str:
    """A frame's file as a reader finds it: from the package (``vllm/v1/...``) or from this project's root."""
    for root in ("site-packages/", "dist-packages/", f"{_PROJECT_ROOT}/"):
        if root in filename:
            return filename.split(root, 1)[1]
    return filename


def out_of_memory_reason(exc: BaseException, device: Mapping[str, Any]) -> str | None:
    """The reason a GPU member's record gives when it ran out of memory: its share, what to change, then the error
    and the innermost frames; None when ``exc`` is no out-of-memory error or the member did not train on a GPU."""
    fix = _memory_fix(exc) if device.get("type") == "cuda" else None
    if fix is None:
        return None
    sharers = int(device.get(MEMBER_GPU_SHARERS_KEY) or 1)
    fraction = float(device.get(MEMBER_GPU_MEMORY_KEY) or 1.0)
    fixes = [fix]
    if sharers > 1:
        fixes.append("set resources.members_per_gpu=1")
    elif fraction < 1:
        fixes.append("raise resources.gpu_memory_fraction")
    tail = _traceback_tail(exc)
    card = card_use_text(device)
    return (f"out of GPU memory within its share: {share_text(device)}" + (f" ({card})" if card else "")
            + f"; {', or '.join(fixes)}. {type(exc).__name__}: {exc}" + (f" [at {tail}]" if tail else ""))


def gpu_uuid(index: int | None) -> str:
    """The physical identity of CUDA device ``index`` (None: the current one) of this process: members that see
    one card under different indices (each its own CUDA_VISIBLE_DEVICES) get the same UUID."""
    import torch

    return str(torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).uuid)


def engine_start_turn_for(backend: str, device: Any, sharers: int) -> AbstractContextManager[None]:
    """The turn a member takes to build its trainer: the card's engine-start lock (inner_loop/generation/
    engine_start.py) for a colocated vLLM engine on a GPU shared with others; nothing to wait for otherwise."""
    if backend != VLLM_COLOCATE or getattr(device, "type", None) != "cuda" or sharers < 2:
        return nullcontext()
    return engine_start_turn(gpu_uuid(device.index))
