"""A member's training progress while it runs: ``progress.json`` in its work dir, rewritten at each logging step.

Advisory, for people and the orchestrator's warnings (meta.status, meta/search/live_watch.py): a missing or unreadable
file means "no progress known", never a failure. Standard library only: member processes import it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from results.store.atomic import atomic_write_json
from results.store.layout import PROGRESS_FILE

#: how many of the latest logged values the file keeps for the per-step series (a warning needs a streak)
RECENT = 5


@dataclass
class MemberProgress:
    step: int
    max_steps: int
    started_at: float  # wall clock of this run's first logged step (a requeued run starts again)
    updated_at: float
    seconds_per_step: float | None = None
    reward_mean: float | None = None
    zero_std_fraction: float | None = None  # TRL's frac_reward_zero_std: groups whose rewards are all equal
    regularizer_grad_share: float | None = None
    zero_std_recent: list[float] = field(default_factory=list)
    grad_share_recent: list[float] = field(default_factory=list)

    def remaining_s(self) -> float | None:
        """Seconds to the last step at the measured rate; None before a rate is known."""
        if self.seconds_per_step is None:
            return None
        return max(0, self.max_steps - self.step) * self.seconds_per_step


def write_progress(work_dir: str | Path, progress: MemberProgress) -> None:
    atomic_write_json(Path(work_dir) / PROGRESS_FILE, asdict(progress))


def read_progress(work_dir: str | Path) -> MemberProgress | None:
    try:
        data: dict[str, Any] = json.loads((Path(work_dir) / PROGRESS_FILE).read_text())
        known = {k: data[k] for k in MemberProgress.__dataclass_fields__ if k in data}
        return MemberProgress(**known)
    except (OSError, ValueError, TypeError):
        return None
