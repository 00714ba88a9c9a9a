"""How a member's segment continues a run: a run of its own (``OwnRun``), or one truncation of an es=nres particle's
run (``ParticleTruncation``; results/store/truncation.py is the contract). The member's lifecycle asks
``continuation(spec, work_dir)`` and reads no other difference between the two.

The run's Trainer is built for the particle's whole run (train.steps = the horizon, so the learning-rate schedule is
defined over it) and resumed from the particle's boundary checkpoint at ``start`` (a TRL checkpoint folder: weights,
optimizer, scheduler, RNG and trainer state); it stops at ``stop`` with a checkpoint there, which is published as the
particle's next boundary. A requeue in mid-truncation resumes from the member's own newer checkpoint instead, as any
member's does; one that finds its own checkpoint at ``stop`` already (stopped after the save, before publishing) trains
nothing: it scores and publishes that checkpoint (a resumed Trainer would train one more step before StopAtStep acts).
The map is the member's own (set at the truncation's start): the regularizer changes from that step on.

Publishing hard-links the checkpoint's files into the particle's folder and then drops the member's own name for it:
the checkpoint's bytes are written once (by the Trainer's save), not copied.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME

from inner_loop.training.checkpoints import checkpoint_folders, last_checkpoint
from results.store.layout import CHECKPOINT_DIR, CHECKPOINT_TRASH_DIR
from core.records import MemberSpec
from results.store.truncation import (END_SCORE, START_SCORE, START_STEP, STOP_STEP, Truncation, publish_boundary,
                                      read_boundary)

logger = logging.getLogger(__name__)

#: the boundary record's key for the score at the truncation's start, kept so a member killed after publishing its
#: boundary, before its result, reports the same change when it runs again
START_SCORE_KEY = "start_score"


@dataclass(frozen=True)
class Outcome:
    """What the end of a member's segment makes of its validation pass@1: its fitness and what its record keeps."""

    fitness: float
    diagnostics: dict[str, float]
    #: the run's step at the end (a truncation recorded from its published boundary, without a trainer)
    steps_done: int = 0


class OwnRun:
    """A member that trains a run of its own (every member but an online searcher's, and a single run): it resumes
    from its own newest checkpoint, trains to its schedule's end, and its fitness is its validation pass@1."""

    #: the stage a failure while standing the trainer at its start is recorded under
    start_stage = "model and trainer setup"
    #: the stage a failure while closing its segment is recorded under
    finish_stage = "evaluation"

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    def done_already(self, generation: int) -> Outcome | None:
        """The outcome when an earlier run of this member finished its segment but not its record; None: train."""
        return None

    def start(self, trainer: Trainer, score_untouched: Callable[[], float]) -> str | None:
        """Stand the trainer at the segment's start; returns the checkpoint folder it resumes from (None: step 0)."""
        return last_checkpoint(self.work_dir)

    def trained_already(self, resume: str | None) -> bool:
        """Whether ``resume`` stands at the segment's stop already (nothing to train)."""
        return False

    def finish(self, score: float, generation: int) -> Outcome:
        """The member's outcome from its validation pass@1 at the segment's end."""
        return Outcome(score, {})


class ParticleTruncation(OwnRun):
    """A member that trains one truncation of its particle's run (the module docstring): from the particle's boundary
    checkpoint at ``start`` to ``stop``, published as the next boundary; its fitness is the change of validation
    pass@1 over the truncation."""

    start_stage = "the truncation's start"
    finish_stage = "publishing the truncation's checkpoint"

    def __init__(self, piece: Truncation, work_dir: Path) -> None:
        super().__init__(work_dir)
        self.piece = piece
        self.start_score: float | None = None

    def done_already(self, generation: int) -> Outcome | None:
        scores = finished(self.piece, generation)
        if scores is None:
            return None
        logger.info("member %s: its truncation's checkpoint is published already; recording it", self.work_dir)
        release(self.piece, self.work_dir)  # killed between publishing and removing its own copy
        return self._outcome(scores, steps_done=self.piece.stop)

    def start(self, trainer: Trainer, score_untouched: Callable[[], float]) -> str | None:
        self.start_score = start_score(self.piece)
        if self.start_score is None:  # step 0: the untouched model, scored before it trains
            self.start_score = score_untouched()
        trainer.add_callback(StopAtStep(self.piece.stop))
        return resume_folder(self.piece, self.work_dir)

    def trained_already(self, resume: str | None) -> bool:
        return at_stop(self.piece, resume)

    def finish(self, score: float, generation: int) -> Outcome:
        if self.start_score is None:
            raise RuntimeError("a truncation finished without its start's score (start() was not called)")
        scores = (self.start_score, score)
        publish(self.piece, self.work_dir, scores, generation)
        return self._outcome(scores)

    def _outcome(self, scores: tuple[float, float], steps_done: int = 0) -> Outcome:
        """Its change of validation pass@1, and its steps and scores at both ends as the record keeps them."""
        return Outcome(scores[1] - scores[0], {START_STEP: float(self.piece.start), STOP_STEP: float(self.piece.stop),
                                               START_SCORE: scores[0], END_SCORE: scores[1]}, steps_done)


def continuation(spec: MemberSpec, work_dir: Path) -> OwnRun:
    """How ``spec``'s segment continues a run: a truncation of the particle run its spec names, else a run of its own."""
    piece = Truncation.of_spec(spec)
    return OwnRun(work_dir) if piece is None else ParticleTruncation(piece, work_dir)


class StopAtStep(TrainerCallback):
    """Stop training at ``stop`` with a checkpoint saved there (the particle's next boundary)."""

    def __init__(self, stop: int) -> None:
        self.stop = int(stop)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - the Trainer's callback signature
        if state.global_step >= self.stop:
            control.should_save = True
            control.should_training_stop = True
        return control


def resume_folder(piece: Truncation, work_dir: Path) -> str | None:
    """Where the Trainer resumes: the member's own newest checkpoint (a requeue in mid-truncation, or at ``stop``:
    see ``at_stop``), else the particle's boundary at ``start`` (None at step 0: a fresh run). A missing boundary is
    an error naming it.

    A checkpoint of its own past ``stop`` (what a retry trained before members stopped at their own checkpoint at
    ``stop``) is not the particle's state at ``stop``, and the Trainer's rotation would delete the checkpoint at
    ``stop`` beside it: it is removed, and the truncation goes on from the newest checkpoint before it (resumes are
    bitwise the uninterrupted run, so the boundary is the one an uninterrupted member would have published)."""
    for folder in checkpoint_folders(work_dir):
        if int(folder.name.rpartition("-")[2]) > piece.stop:  # the listed folders are checkpoint-<step>
            logger.warning("member %s: removing %s, past its truncation's stop at step %d", work_dir, folder.name,
                           piece.stop)
            _remove(folder, work_dir)
    own_checkpoint = last_checkpoint(work_dir)
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


def at_stop(piece: Truncation, resume: str | None) -> bool:
    """True when the Trainer would resume at the truncation's ``stop``: the member's own checkpoint there, saved by an
    earlier run of it that was stopped before it published. Training from it would run one step past ``stop``."""
    if resume is None:
        return False
    return int(json.loads((Path(resume) / TRAINER_STATE_NAME).read_text())["global_step"]) == piece.stop


def load_trained(trainer: Trainer, folder: str) -> None:
    """Stand the Trainer where the run that saved ``folder`` ended, without training: its weights (what is scored
    and published) and its state (steps and log history, what the member's record reads)."""
    trainer.state = TrainerState.load_from_json(str(Path(folder) / TRAINER_STATE_NAME))
    trainer._load_from_checkpoint(folder)  # the weights as train(resume_from_checkpoint=folder) loads them


def publish(piece: Truncation, work_dir: Path, scores: tuple[float, float], generation: int) -> Path:
    """Publish the member's checkpoint at ``stop`` as the particle's next boundary: its files hard-linked into the
    boundary (a copy only where a link cannot be made, e.g. another filesystem), then the member's own name for them
    removed, so that pruning the boundary later frees its bytes. A kill before the boundary is in place leaves the
    member's checkpoint as it was (its next run publishes it); one after, the boundary (its next run finds it)."""
    source = _own_at_stop(piece, work_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"the truncation ended without its checkpoint at step {piece.stop} ({source})")
    target = publish_boundary(piece, scores[1], generation,
                              lambda folder: shutil.copytree(source, folder, copy_function=_link_or_copy,
                                                             dirs_exist_ok=True),
                              extra={START_SCORE_KEY: scores[0]})
    release(piece, work_dir)
    return target


def release(piece: Truncation, work_dir: Path) -> None:
    """Remove the member's own checkpoint at ``stop`` once the particle's boundary holds it. A failure to delete is
    logged, not raised: the boundary is published, and what is left goes with the member's checkpoint policy."""
    source = _own_at_stop(piece, work_dir)
    if source.is_dir():
        try:
            _remove(source, work_dir)
        except OSError as exc:
            logger.warning("member %s: could not remove %s after publishing it: %s", work_dir, source, exc)


def _own_at_stop(piece: Truncation, work_dir: Path) -> Path:
    return work_dir / CHECKPOINT_DIR / f"checkpoint-{piece.stop}"


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, target)


def _remove(folder: Path, work_dir: Path) -> None:
    """Renamed into the member's trash first (one atomic step), so a kill mid-delete never leaves a partial folder
    under a checkpoint's name; the checkpoint policy empties the trash."""
    trash = work_dir / CHECKPOINT_TRASH_DIR
    trash.mkdir(exist_ok=True)
    moved = trash / f"{folder.name}-{uuid.uuid4().hex[:8]}"
    os.replace(folder, moved)
    shutil.rmtree(moved)
