"""The trainer's callbacks for a member's checkpoints: the peak disk use its record carries (DiskUsageCallback) and a
checkpoint saved at the end of the step under way when its job is told it ends (SaveOnNoticeCallback). Apart from
inner_loop/training/checkpoints.py, which the orchestrator imports without transformers."""
from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

import inner_loop.process.notice as notice
from inner_loop.training.checkpoints import checkpoint_folders, dir_bytes

logger = logging.getLogger(__name__)


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
