"""A member's TRL checkpoints: which one to resume from, what is kept once the member is final, and its disk use.
No transformers import: the orchestrator settles its members' checkpoints with this module (``finalize_member``),
and the trainer's callbacks that measure and save them live in inner_loop/training/callbacks.py.

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

from core.records import MemberSpec
from inner_loop.config import KEEP_CHECKPOINTS, InnerConfig
from results.store.member_files import read_result
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


def finalize_member(spec: MemberSpec | Mapping[str, Any]) -> None:
    """Apply train.keep_checkpoints to a member the search has settled for good (its last attempt failed or
    timed out: train_in_process keeps a failed member's checkpoints for a retry, and a settled member is never
    called again, so without this they would stay). Nothing happens before a final result.json exists. Called by
    the orchestrator for every settled member, so it imports no trainer: ~9 CPU-s of TRL and transformers."""
    spec = spec if isinstance(spec, MemberSpec) else MemberSpec.from_dict(spec)
    work_dir = Path(spec.work_dir)
    if read_result(work_dir) is not None:
        settle_after_final(work_dir, spec.inner, spec.seed)
