"""One NM-GRPO training run: models, tasks, the GBMPO trainer, validation; its member program is
inner_loop.member.entry:program."""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ``inner_loop:train_member``, an entry point earlier searches may have stored: the member program's old name.
    # Lazy: importing the package (e.g. for inner_loop.tasks) must not pull in the member's modules.
    if name == "train_member":
        from inner_loop.member.entry import train_member

        return train_member
    raise AttributeError(f"module 'inner_loop' has no attribute {name!r}")


__all__ = ["train_member"]
