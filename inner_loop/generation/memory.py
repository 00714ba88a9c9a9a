"""The memory a member's generation cache may take, from the member's own allocation.

Why not the machine's: members share nodes (several array tasks on one node, several local processes on one
machine), so a cache sized from the machine's free RAM, as TRL's continuous-batching default (half of it) and a
large ``VLLM_CPU_KVCACHE_SPACE`` would be, lets one member take what the others were promised and the node's OOM
killer end them all. One owner for the budget: the vLLM CPU cache and the continuous-batching paged cache read it.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: Share of the member's memory allocation its generation cache may take (the weights, optimizer state,
#: activations and the reference copy take the rest).
CACHE_SHARE_OF_ALLOCATION = 0.25
#: The cache when nothing bounds the member (a local process without a limit): fixed, never a share of the
#: machine's RAM, which other members share.
UNBOUNDED_MEMBER_CACHE_BYTES = 1 << 30
#: A cache smaller than this cannot hold one group's completions at the presets' lengths.
MIN_CACHE_BYTES = 256 << 20
#: Limits at or above this are "no limit" (cgroup v1 writes a page-rounded 2**63 - 1).
_NO_LIMIT = 1 << 60


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= _NO_LIMIT:  # v2 writes "max"
        return None
    return int(text)


def _own_cgroup_limit(proc_cgroup: Path, cgroup_root: Path) -> int | None:
    """This process's cgroup memory limit in bytes (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``, the
    smallest on the path up to the root: SLURM's task/cgroup plugin sets it on the job's or the step's cgroup),
    or None when nothing limits it."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            base, name = cgroup_root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = cgroup_root / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / path.lstrip("/")
        while True:
            limit = _read_limit(folder / name)
            if limit is not None:
                limits.append(limit)
            if folder == base or folder.parent == folder:
                break
            folder = folder.parent
    return min(limits) if limits else None


def _slurm_allocation(environ: Mapping[str, str]) -> int | None:
    """Bytes SLURM allocated to this job on its node (``--mem`` or ``--mem-per-cpu`` x CPUs), from its env."""
    if environ.get("SLURM_MEM_PER_NODE"):
        return int(environ["SLURM_MEM_PER_NODE"]) << 20
    per_cpu, cpus = environ.get("SLURM_MEM_PER_CPU"), environ.get("SLURM_CPUS_ON_NODE")
    if per_cpu and cpus:
        return int(per_cpu) * int(cpus) << 20
    return None


def member_memory_bytes(environ: Mapping[str, str] | None = None, proc_cgroup: Path = Path("/proc/self/cgroup"),
                        cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this member may use: the smaller of its cgroup limit and SLURM's allocation; None if unbounded."""
    environ = os.environ if environ is None else environ
    found = [b for b in (_own_cgroup_limit(proc_cgroup, cgroup_root), _slurm_allocation(environ)) if b]
    return min(found) if found else None


def generation_cache_bytes(allocation: int | None) -> int:
    """Bytes the member's generation cache may take: a share of its allocation, or a fixed size if unbounded."""
    if allocation is None:
        return UNBOUNDED_MEMBER_CACHE_BYTES
    return max(MIN_CACHE_BYTES, int(allocation * CACHE_SHARE_OF_ALLOCATION))


def member_gpu_budget_bytes(total_bytes: int, fraction: float) -> int:
    """The GPU memory this member may use: its share (resources.gpu_memory_fraction, 1 for one member per GPU) of its
    GPU's total memory. Never what the device has free: that counts the memory of members packed beside it, and
    whatever this member already holds, so the sizes it gives change from one moment to the next."""
    return int(total_bytes * fraction)


#: the caching allocator's id of its default pool; every other pool is private (a CUDA graph's, a MemPool's)
DEFAULT_POOL_ID = (0, 0)


def private_pool_bytes(segments: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(reserved, idle) bytes of the allocator's private pools in ``segments`` (``torch.cuda.memory_snapshot()``).

    Why: CUDA graphs (the compiled decode step's, ``train.decode_cache=persistent_compiled``) allocate from a private
    pool that stays reserved from one replay to the next, through the backward; an idle block of it is never handed to
    another tensor, unlike an idle block of the default pool, so it is memory the member holds, not room."""
    reserved = idle = 0
    for segment in segments:
        if tuple(segment.get("segment_pool_id") or DEFAULT_POOL_ID) == DEFAULT_POOL_ID:
            continue
        reserved += int(segment["total_size"])
        idle += int(segment["total_size"]) - int(segment["allocated_size"])
    return reserved, idle


def held_gpu_bytes(device: Any) -> int:
    """The GPU memory this member holds that no new tensor can use: its live tensors (a static KV cache among them)
    plus the idle part of its private pools (CUDA graphs'). What a budget's room is counted against."""
    import torch

    _, idle = private_pool_bytes(torch.cuda.memory_snapshot())
    return int(torch.cuda.memory_allocated(device)) + idle
