"""Trainer callbacks that make a running member visible: progress.json and TRL's metrics in TensorBoard."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from results.store.layout import TENSORBOARD_DIR
from core.keys import FRAC_REWARD_ZERO_STD, GRAD_SHARE, REWARD
from results.store.member_files import RECENT, MemberProgress, write_progress


class ProgressFileCallback(TrainerCallback):
    """Rewrites progress.json (atomically, once per logging step) with the step, the rate and the latest values."""

    def __init__(self, work_dir: str | Path) -> None:
        self.work_dir = Path(work_dir)
        self.progress: MemberProgress | None = None
        self._first: tuple[int, float] | None = None  # (step, time) of this run's first log

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
        logs = logs or {}
        if REWARD not in logs and FRAC_REWARD_ZERO_STD not in logs:
            return  # the final summary log (train_runtime, ...) carries no step values
        now = time.time()
        step = int(state.global_step)
        if self._first is None:
            self._first = (step, now)
        first_step, first_time = self._first
        rate = (now - first_time) / (step - first_step) if step > first_step else None
        old = self.progress
        self.progress = MemberProgress(
            step=step, max_steps=int(state.max_steps), started_at=first_time, updated_at=now, seconds_per_step=rate,
            # a value not logged at this step (the gradient share is not measured at every one) keeps the last
            reward_mean=_latest(logs, REWARD, old.reward_mean if old else None),
            zero_std_fraction=_latest(logs, FRAC_REWARD_ZERO_STD, old.zero_std_fraction if old else None),
            regularizer_grad_share=_latest(logs, GRAD_SHARE, old.regularizer_grad_share if old else None),
            zero_std_recent=_recent(old.zero_std_recent if old else [], logs.get(FRAC_REWARD_ZERO_STD)),
            grad_share_recent=_recent(old.grad_share_recent if old else [], logs.get(GRAD_SHARE)),
        )
        try:
            write_progress(self.work_dir, self.progress)
        except OSError:
            pass  # advisory: a full or flaky disk must not stop training


def tensorboard_callback(work_dir: str | Path) -> TrainerCallback:
    """transformers' own TensorBoard callback, writing into the member's work dir (not the checkpoints dir)."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(Path(work_dir) / TENSORBOARD_DIR)))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _latest(logs: dict[str, Any], key: str, previous: float | None) -> float | None:
    value = _number(logs.get(key))
    return previous if value is None else value


def _recent(values: list[float], new: Any) -> list[float]:
    number = _number(new)
    return (values + [number])[-RECENT:] if number is not None else values
