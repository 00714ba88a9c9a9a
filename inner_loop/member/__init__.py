"""The member process: its program (entry.py, ``inner.entrypoint``), its lifecycle (lifecycle.py: train_in_process),
what it checks and is given on its node (device, preflight, staging, compute_mode, gpu_share), its job's end notice
(notice) and its result record (records)."""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ``inner.entrypoint=inner_loop.member:train_member``, as run directories from before inner_loop/member.py became
    # this package stored it, now names the member program with its hooks (it named the bare lifecycle function then,
    # which had validate and finalize but not the pinned numerics a config may ask for). Lazy: no torch at the door.
    if name == "train_member":
        from inner_loop.member.entry import train_member

        return train_member
    raise AttributeError(f"module 'inner_loop.member' has no attribute {name!r}")
