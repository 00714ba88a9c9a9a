"""The trainer's callbacks: what makes a running member visible (progress.json, TRL's metrics in TensorBoard), its
peak disk use (DiskUsageCallback, which its record carries) and a checkpoint saved at the end of the step under way
when its job is told it ends (SaveOnNoticeCallback). Apart from inner_loop/training/checkpoints.py, which the
orchestrator imports without transformers."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

import inner_loop.process.notice as notice
from core.keys import FRAC_REWARD_ZERO_STD, GRAD_SHARE, REWARD
from inner_loop.training.checkpoints import checkpoint_folders, dir_bytes
from results.store.layout import TENSORBOARD_DIR
from results.store.member_files import RECENT, MemberProgress, write_progress

logger = logging.getLogger(__name__)


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


class DiskUsageCallback(TrainerCallback, ExportableState):
    """Tracks the peak apparent size of a member's work dir over its training, across resumes.

    Measured when training (re)starts and after every checkpoint save. The Trainer deletes rotated-out
    checkpoints inside the save, before ``on_save`` runs, yet they were on disk together with the new one; so
    a checkpoint that was present at the previous measurement and is gone now counts toward this save's peak.
    The peak travels in trainer_state.json (the Trainer stores every ExportableState callback's ``state()``
    in each checkpoint) and is read back when a resumed run begins.
    """

    def __init__(self, work_dir: str, peak_bytes: int = 0) -> None:
        self.work_dir = str(work_dir)
        self.peak_bytes = int(peak_bytes)
        self._checkpoint_bytes: dict[str, int] = {}

    def state(self) -> dict[str, Any]:
        return {"args": {"work_dir": self.work_dir}, "attributes": {"peak_bytes": self.peak_bytes}}

    def measure(self) -> int:
        """Update the peak from the work dir as it is now; returns the peak."""
        sizes = {p.name: dir_bytes(p) for p in checkpoint_folders(self.work_dir)}
        rotated_out = sum(size for name, size in self._checkpoint_bytes.items() if name not in sizes)
        self.peak_bytes = max(self.peak_bytes, dir_bytes(self.work_dir) + rotated_out)
        self._checkpoint_bytes = sizes
        return self.peak_bytes

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stored = state.stateful_callbacks
        saved = stored.get(type(self).__name__)
        saved = saved[0] if isinstance(saved, list) and saved else saved
        if isinstance(saved, dict):
            peak = (saved.get("attributes") or {}).get("peak_bytes")
            if isinstance(peak, int) and not isinstance(peak, bool):
                self.peak_bytes = max(self.peak_bytes, peak)
        else:
            # Resumed from a checkpoint written without this callback (an older version): the Trainer's next
            # save looks our entry up by name and would fail with a KeyError without it.
            stored[type(self).__name__] = self.state()
        self.measure()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.measure()


class SaveOnNoticeCallback(TrainerCallback):
    """Saves a checkpoint at the end of the step under way once the member's job was told it ends
    (inner_loop/process/notice.py), then stops the run with NoticeHonoured; the requeued run resumes from that step.

    The save waits for the end of a rollout (``num_iterations`` optimizer steps reuse one generation's completions,
    which a checkpoint does not hold): a run resumed there repeats the uninterrupted run exactly. Put it last
    among the callbacks, so that the others see the save before the run stops."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        notice.training(True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        notice.training(False)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        notice.step_ended()
        if notice.requested() is not None and state.global_step % _rollout_steps(args) == 0:
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        signum = notice.requested()
        if signum is not None and state.global_step % _rollout_steps(args) == 0:
            logger.warning("saved checkpoint-%d on notice; stopping", state.global_step)
            notice.training(False)
            raise notice.NoticeHonoured(signum)


def _rollout_steps(args: Any) -> int:
    """Optimizer steps that train on one generation's completions (TRL: steps_per_generation micro-batches,
    each ``num_iterations`` times, ``gradient_accumulation_steps`` micro-batches a step)."""
    micro = int(getattr(args, "steps_per_generation", None) or args.gradient_accumulation_steps)
    return max(1, micro * int(getattr(args, "num_iterations", 1) or 1) // int(args.gradient_accumulation_steps))
