"""A member's TRL checkpoints: which one to resume from, what is kept once the member is final, and its disk use.

Checkpoints exist so that a preempted or requeued member resumes instead of starting over. At ES scale they are
also the dominant disk cost (a Qwen3-1.7B LoRA checkpoint with Adam state is ~0.84 GB; 16 per member and 180
members make ~2.4 TB per generation), so ``train.keep_checkpoints`` decides what survives a finished member and
every result record carries the member's peak disk use, measured here.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

import inner_loop.process.notice as notice
from inner_loop.config import KEEP_CHECKPOINTS, InnerConfig
# the Trainer's output_dir in a member's work dir, and where a checkpoint goes while it is deleted (re-exported)
from results.store.layout import CHECKPOINT_DIR, CHECKPOINT_TRASH_DIR as TRASH_DIR

logger = logging.getLogger(__name__)


def _step(folder: Path) -> int | None:
    tail = folder.name.rpartition("-")[2]
    return int(tail) if folder.name.startswith("checkpoint-") and tail.isdigit() else None


def checkpoint_folders(work_dir: str | Path) -> list[Path]:
    """The member's ``checkpoint-<step>`` folders, oldest step first (complete or not)."""
    root = Path(work_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _step(p) is not None]
    return sorted(found, key=lambda p: _step(p) or 0)


def checkpoint_complete(folder: Path) -> bool:
    """True when a checkpoint holds weights, optimizer state and a parseable trainer_state.json for its step.

    The Trainer writes a checkpoint's files one after another into its final folder (trainer_state.json last),
    so a kill mid-save leaves a folder that looks like the newest checkpoint but cannot be resumed from.
    """
    step = _step(folder)
    weights = any((folder / name).is_file() for name in ("model.safetensors", "adapter_model.safetensors",
                                                          "pytorch_model.bin", "adapter_model.bin"))
    if step is None or not (weights and (folder / "optimizer.pt").is_file()):
        return False
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and int(state.get("global_step", -1)) == step


def last_checkpoint(work_dir: str | Path) -> str | None:
    """The newest complete TRL checkpoint of this member, if any; incomplete ones (killed mid-save) are skipped."""
    for candidate in reversed(checkpoint_folders(work_dir)):
        if checkpoint_complete(candidate):
            return str(candidate)
        logger.warning("member %s: skipping incomplete checkpoint %s (killed while saving?)", work_dir,
                       candidate.name)
    return None


def dir_bytes(path: str | Path) -> int:
    """Apparent size (sum of file sizes, links not followed) of everything under ``path``; 0 if it is absent.

    Files may vanish while we walk (the Trainer rotating checkpoints): those are skipped, not an error."""
    total = 0
    stack = [Path(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total


def apply_checkpoint_policy(work_dir: str | Path, keep: str) -> list[str]:
    """Delete what ``keep`` does not keep, for a member whose result.json is already final; returns what went.

    ``none``: the whole checkpoint folder; ``last``: every checkpoint but the newest complete one (incomplete
    ones too); ``all``: nothing. Idempotent: it also finishes a deletion that a crash interrupted.
    """
    if keep not in KEEP_CHECKPOINTS:
        raise ValueError(f"train.keep_checkpoints={keep!r} is not one of {list(KEEP_CHECKPOINTS)}")
    work_dir = Path(work_dir)
    trash = work_dir / TRASH_DIR
    removed: list[str] = []
    if keep == "none":
        doomed = [work_dir / CHECKPOINT_DIR] if (work_dir / CHECKPOINT_DIR).exists() else []
    elif keep == "last":
        newest = last_checkpoint(work_dir)
        doomed = [p for p in checkpoint_folders(work_dir) if str(p) != newest]
    else:
        doomed = []
    if trash.exists():
        shutil.rmtree(trash)  # what an interrupted earlier delete left
    if doomed:
        trash.mkdir()
    for number, path in enumerate(doomed):
        # Renamed first (one atomic step), then deleted: an interrupted delete leaves only trash behind.
        os.replace(path, trash / f"{number}-{path.name}")
        removed.append(str(path.relative_to(work_dir)))
    if trash.exists():
        shutil.rmtree(trash)
    if removed:
        logger.info("member %s: keep_checkpoints=%s removed %s", work_dir, keep, ", ".join(removed))
    return removed



def settle_checkpoints(work_dir: Path, keep: str) -> None:
    """``apply_checkpoint_policy`` for a member whose result is final, where a filesystem error (an NFS server
    refusing to drop a busy file) is logged, never raised: raising would turn a finished member into a failed
    one; whatever is left goes on the next call."""
    try:
        apply_checkpoint_policy(work_dir, keep)
    except OSError as exc:
        logger.warning("member %s: could not delete its checkpoints (keep_checkpoints=%s): %s; the next call "
                       "retries", work_dir, keep, exc)


def settle_after_final(work_dir: Path, inner: Mapping[str, Any], seed: int) -> None:
    """Apply train.keep_checkpoints to a member whose result.json was already final when we were called: what a
    crash between writing the result and deleting the checkpoints (or a failed member's kept ones) leaves."""
    if not any((work_dir / name).exists() for name in (CHECKPOINT_DIR, TRASH_DIR)):
        return
    try:
        keep = InnerConfig.from_dict(inner, seed=seed).train.keep_checkpoints
    except ValueError as exc:
        logger.warning("member %s: leaving its checkpoints, its config no longer parses (%s)", work_dir, exc)
        return
    settle_checkpoints(work_dir, keep)

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
