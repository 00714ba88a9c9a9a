"""One NM-GRPO training run: models, tasks, the GBMPO trainer, validation; entry `train_member(spec)`."""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for inner_loop.tasks) must not pull in torch/TRL.
    if name == "train_member":
        from inner_loop.member.lifecycle import train_member

        return train_member
    raise AttributeError(f"module 'inner_loop' has no attribute {name!r}")


__all__ = ["train_member"]
