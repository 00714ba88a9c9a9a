"""es=nres: a member that trains one truncation of its particle's run (results/store/truncation.py is the contract).

The run's Trainer is built for the particle's whole run (train.steps = the horizon, so the learning-rate schedule is
defined over it) and resumed from the particle's boundary checkpoint at ``start`` (a TRL checkpoint folder: weights,
optimizer, scheduler, RNG and trainer state); it stops at ``stop`` with a checkpoint there, which is published as the
particle's next boundary. A requeue in mid-truncation resumes from the member's own newer checkpoint instead, as any
member's does. The map is the member's own (set at the truncation's start): the regularizer changes from that step on.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from transformers import TrainerCallback

from results.store.layout import CHECKPOINT_DIR
from results.store.truncation import Truncation, publish_boundary, read_boundary

logger = logging.getLogger(__name__)

#: the boundary record's key for the score at the truncation's start, kept so a member killed after publishing its
#: boundary, before its result, reports the same change when it runs again
START_SCORE_KEY = "start_score"


class StopAtStep(TrainerCallback):
    """Stop training at ``stop`` with a checkpoint saved there (the particle's next boundary)."""

    def __init__(self, stop: int) -> None:
        self.stop = int(stop)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - the Trainer's callback signature
        if state.global_step >= self.stop:
            control.should_save = True
            control.should_training_stop = True
        return control


def resume_folder(piece: Truncation, own_checkpoint: str | None) -> str | None:
    """Where the Trainer resumes: the member's own checkpoint (a requeue in mid-truncation), else the particle's
    boundary at ``start`` (None at step 0: a fresh run). A missing boundary is an error naming it."""
    if own_checkpoint:
        return own_checkpoint
    if piece.start == 0:
        return None
    folder = piece.boundary(piece.start)
    if read_boundary(folder) is None:
        raise FileNotFoundError(f"particle {piece.particle}: no complete checkpoint at step {piece.start} of run "
                                f"{piece.episode} ({folder})")
    return str(folder)


def start_score(piece: Truncation) -> float | None:
    """Validation pass@1 at the truncation's start, as the particle's boundary recorded it (None at step 0: the
    untouched model is scored before training)."""
    if piece.start == 0:
        return None
    record = read_boundary(piece.boundary(piece.start))
    return float(record["score"]) if record is not None else None


def finished(piece: Truncation, generation: int) -> tuple[float, float] | None:
    """(start, end) scores when this generation's member already published the boundary at ``stop`` (killed before
    its result was written); None otherwise."""
    record = read_boundary(piece.boundary(piece.stop))
    if record is None or record.get("generation") != generation or START_SCORE_KEY not in record:
        return None
    return float(record[START_SCORE_KEY]), float(record["score"])


def publish(piece: Truncation, work_dir: Path, scores: tuple[float, float], generation: int) -> Path:
    """Copy the member's checkpoint at ``stop`` to the particle's folder as its next boundary."""
    source = work_dir / CHECKPOINT_DIR / f"checkpoint-{piece.stop}"
    if not source.is_dir():
        raise FileNotFoundError(f"the truncation ended without its checkpoint at step {piece.stop} ({source})")
    return publish_boundary(piece, scores[1], generation,
                            lambda folder: shutil.copytree(source, folder, dirs_exist_ok=True),
                            extra={START_SCORE_KEY: scores[0]})
