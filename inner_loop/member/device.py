"""The device a member trains on: refuse a GPU member without a usable GPU, and name the device in its record.

Why: a member's device used to follow ``torch.cuda.is_available()`` alone, so a GPU member on a node with a CPU build
of torch, a driver older than the wheel, or an empty ``CUDA_VISIBLE_DEVICES`` trained on a few CPU threads until its
timeout, and nothing said so. A member whose resources ask for a GPU (``resources.gpus``, carried in its inner config
as ``gpus``) checks here, before its model is loaded, and a node that cannot give one ends the job with
``DeviceUnavailableError``: a BaseException, so it passes the member's own ``except Exception`` and the job wrapper,
and the job ends without a result, like a lost node (the launcher resubmits it, the init is not charged).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from results.store.node_failure import node_name
from core.records import GRAPH_POOL_KEY, MEMBER_GPUS_KEY, PEAK_ALLOCATED_KEY, PEAK_RESERVED_KEY

logger = logging.getLogger(__name__)


class DeviceUnavailableError(BaseException):
    """The node cannot give this member the GPU its resources ask for: the node's failure, not the member's."""


def gpus_asked(inner: Mapping[str, Any]) -> int:
    """GPUs a member's inner config asks for (0 without the key); ValueError naming the key for a bad value."""
    value = inner.get(MEMBER_GPUS_KEY, 0) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"inner {MEMBER_GPUS_KEY}={value!r} must be a GPU count >= 0 (resources.gpus)")
    return value


def require_device(inner: Mapping[str, Any]) -> dict[str, Any]:
    """The device this member will train on (``describe_device``); DeviceUnavailableError, naming torch's build, its
    CUDA version, what the driver said and CUDA_VISIBLE_DEVICES, when the member asks for a GPU and CUDA is not
    usable, or when TRL's kernels cannot be built and launched on it (``kernel_problem``). Call it before the model is
    loaded: a refusal then costs seconds, not a timeout."""
    import torch

    asked = gpus_asked(inner)
    if asked >= 1:
        problem = _cuda_problem(torch)
        if problem:
            raise DeviceUnavailableError(
                f"node {node_name()}: this member asks for {asked} GPU (resources.gpus) and CUDA is not "
                f"usable: {problem}. torch {torch.__version__} built with CUDA {torch.version.cuda or 'none (a CPU build)'}"
                f"; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}. It refused to train on "
                "the CPU; fix the node (driver, torch build, GPU allocation) or set resources.gpus=0 for a CPU run"
            )
        problem = kernel_problem(torch.device("cuda", torch.cuda.current_device()))
        if problem:
            raise DeviceUnavailableError(
                f"node {node_name()}: TRL's Triton log-prob kernels, which every training step launches, do not run on "
                f"this GPU: {problem}. Triton compiles C code at a kernel's first launch (a C compiler: $CC, gcc or "
                "clang; Python's headers, Python.h; libcuda): install them on the node, or point CC and "
                "TRITON_LIBCUDA_PATH at them (launcher.setup); docs/gpus.md"
            )
    return describe_device()


def kernel_problem(device: Any) -> str:
    """Run TRL's per-token log-prob kernels (the fused LM head's and ``selective_log_softmax``'s), forward and
    backward, at tiny shapes on ``device``; the error as TRL or Triton gave it, or "" when they ran.

    Why here, before the model loads: Triton builds its launchers with the node's C compiler at the first launch, so
    a node without one failed every member at its first step, charged as the member's failure; found here it is the
    node's (excluded, the member resubmitted). On devices without Triton TRL runs the same functions in torch."""
    import torch

    try:
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import selective_log_softmax
    except ImportError as exc:  # the training step would fail the same way: the node's environment is broken
        return f"TRL's kernels cannot be imported: {exc}"
    try:
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(8, 16, generator=generator).to(device).requires_grad_(True)
        weight = torch.randn(64, 16, generator=generator).to(device).requires_grad_(True)
        targets = torch.randint(0, 64, (8,), generator=generator).to(device)
        logprobs, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32, None, 1.0,
                                                             ("entropy",))
        logits = (hidden @ weight.T).contiguous()
        picked = selective_log_softmax(logits, targets)
        (logprobs.sum() + entropy.sum() + picked.sum()).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler or the driver says is the cause to report
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
    return ""


def _cuda_problem(torch: Any) -> str:
    """Why CUDA cannot be used here, in torch's and the driver's words; '' when it can."""
    if not torch.version.cuda:
        return "this torch is a CPU build (install a CUDA wheel of torch)"
    try:
        torch.cuda.init()  # raises with the driver's own message (too old, no device, not loaded)
    except Exception as exc:  # noqa: BLE001 - whatever the driver says is the cause to report
        return f"the driver said: {type(exc).__name__}: {exc}"
    if torch.cuda.device_count() < 1:
        return "the driver reports no device (CUDA_VISIBLE_DEVICES empty or naming no GPU)"
    return ""


def describe_device() -> dict[str, Any]:
    """The device this process trains on, for the record: type, name, total memory, torch and CUDA versions. On the
    CPU: ``cpu`` and the CPU's model name."""
    import torch

    from inner_loop.process.pinned import cpu_name

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(type="cuda", name=str(props.name), memory_bytes=int(props.total_memory),
                    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    else:
        info.update(type="cpu", name=cpu_name(), memory_bytes=None)
    return info


def with_peak_memory(device: Mapping[str, Any]) -> dict[str, Any]:
    """``device`` plus this process's GPU memory (bytes; None on the CPU): ``peak_memory_bytes``, torch's peak
    allocation; ``peak_reserved_bytes``, the most its allocator held from the driver, which is what the member's cap
    (inner_loop/process/gpu_share.py) is counted against and what k members on one card add up to: a static KV cache
    and the CUDA graphs' private pools stay held through the backward, where a dynamic cache is freed before it;
    ``graph_pool_bytes``, what the private pools (CUDA graphs') held at the end."""
    info = dict(device)
    figures: dict[str, int | None] = dict.fromkeys((PEAK_ALLOCATED_KEY, PEAK_RESERVED_KEY, GRAPH_POOL_KEY))
    if info.get("type") == "cuda":
        import torch

        from inner_loop.generation.memory import private_pool_bytes

        try:
            figures = {PEAK_ALLOCATED_KEY: int(torch.cuda.max_memory_allocated()),
                       PEAK_RESERVED_KEY: int(torch.cuda.max_memory_reserved()),
                       GRAPH_POOL_KEY: private_pool_bytes(torch.cuda.memory_snapshot())[0]}
        except Exception as exc:  # noqa: BLE001 - a diagnostic must never fail a finished member
            logger.warning("could not read the peak GPU memory: %s", exc)
    info.update(figures)
    return info
