"""The one writer and reader of a member's GPU_SHARE_FILE: which task and GPU it shared, and with which members.

Why: with ``resources.members_per_gpu`` >= 2 several members train on one card, and a member's step time, peak
memory and even an out-of-memory failure depend on who it shared the card with. The launcher side writes the file
into the member's work dir before the member starts (a packed SLURM task for its members, ``launcher=local`` when
it puts a member into a GPU slot); the members table and ``meta.status`` read it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from results.store.atomic import atomic_write_json
from results.store.layout import GPU_SHARE_FILE


def write_gpu_share(work_dir: str | Path, task: str, gpus: str, members: Sequence[int], members_per_gpu: int) -> None:
    """Record that the member in ``work_dir`` runs in ``task`` (a SLURM task id, a local job id) on ``gpus`` (as
    the member sees them named: CUDA_VISIBLE_DEVICES, or "" before the node is known) beside ``members`` (indices
    of the other members of its generation on that card)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(work_dir) / GPU_SHARE_FILE, {
        "task": str(task), "gpus": str(gpus), "shared_with": sorted({int(m) for m in members}),
        "members_per_gpu": int(members_per_gpu),
    })


def read_gpu_share(work_dir: str | Path) -> dict[str, Any] | None:
    """{task, gpus, shared_with, members_per_gpu} of the member's last run, or None (it ran alone on its GPU, or
    the file is absent or unreadable)."""
    try:
        share = json.loads((Path(work_dir) / GPU_SHARE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(share, dict) or not isinstance(share.get("shared_with"), list):
        return None
    return share


def share_text(share: dict[str, Any] | None) -> str:
    """One cell of the members table: 'task 123_4, GPU 0, with 6, 7' (empty for a member alone on its GPU)."""
    if not share:
        return ""
    others = ", ".join(str(m) for m in share.get("shared_with") or []) or "none"
    gpus = f", GPU {share['gpus']}" if share.get("gpus") else ""
    return f"task {share.get('task')}{gpus}, with {others}"
