"""A member's result record, built from what its run got done and written atomically to ``<work_dir>/result.json``.

One place decides what an `ok` and a `failed` record carry (fitness and validation figures, diagnostics, steps,
wall time, peak disk), so a member that fails late keeps what it measured and a finished one never lacks a field.
The record written here is the member's only write of result.json: the job wrapper and the seed group (launch/)
find it and keep it instead of writing it again (results.store.member_files.write_final_result).
"""
from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from inner_loop.training.callbacks import DiskUsageCallback
from inner_loop.training.checkpoints import dir_bytes
from inner_loop.config import InnerConfig
from inner_loop.member.device import with_peak_memory
from inner_loop.training.diagnostics import diagnostics_from_history
from inner_loop.training.evaluate import EvalResult
from inner_loop.training.truncation import Outcome
from inner_loop.process.gpu_share import out_of_memory_reason
from inner_loop.loss.regularizers import warn_if_inert
from inner_loop.grpo.trainer import MirrorGRPOTrainer, NonFiniteLossError
from core.records import ResultRecord
from results.store.member_files import write_final_result

logger = logging.getLogger(__name__)


def peak_disk(trainer: MirrorGRPOTrainer, work_dir: Path) -> int | None:
    """Peak bytes of the work dir: the max over checkpoint saves (the callback) and the dir as it is now; None
    if the filesystem would not say (a diagnostic must never turn a finished member into a failed one)."""
    tracker = next((c for c in trainer.callback_handler.callbacks if isinstance(c, DiskUsageCallback)), None)
    try:
        return tracker.measure() if tracker is not None else dir_bytes(work_dir)
    except OSError as exc:
        logger.warning("member %s: could not measure its disk use: %s", work_dir, exc)
        return None


def record_failure(work_dir: Path, stage: str, exc: Exception, trainer: MirrorGRPOTrainer | None,
                   started: float, device: Mapping[str, Any] | None = None) -> ResultRecord:
    """Write and return the `failed` record of a member that raised in ``stage``, with what it got done (steps,
    diagnostics, disk) where a trainer exists. Called inside the ``except`` block (it logs the traceback)."""
    if isinstance(exc, NonFiniteLossError):  # an outcome of the mirror map, not a bug: no traceback
        logger.warning("member %s failed in %s: %s", work_dir, stage, exc)
        reason = str(exc)
    else:
        logger.error("member %s failed in %s:\n%s", work_dir, stage, traceback.format_exc())
        # out of GPU memory: the record names the member's share of the card, so a packed member's failure reads
        # as its own (inner_loop/process/gpu_share.py)
        reason = out_of_memory_reason(exc, device or {}) or f"{type(exc).__name__}: {exc}"
    work_dir.mkdir(parents=True, exist_ok=True)
    record = ResultRecord(
        status="failed", error=f"{stage}: {reason}", wall_time_s=time.monotonic() - started,
        steps_done=trainer.state.global_step if trainer is not None else 0,
        diagnostics=diagnostics_from_history(trainer.state.log_history) if trainer is not None else {},
        disk_peak_bytes=peak_disk(trainer, work_dir) if trainer is not None else None,
        generation=trainer.generation_summary() if trainer is not None else {},
        device=with_peak_memory(device) if device else {},
    )
    return write_final_result(work_dir, record)


def record_success(work_dir: Path, cfg: InnerConfig, trainer: MirrorGRPOTrainer, evaluation: EvalResult,
                   started: float, evaluations: Mapping[str, Mapping[str, Any]] | None = None,
                   device: Mapping[str, Any] | None = None, outcome: Outcome | None = None) -> ResultRecord:
    """Write and return the `ok` record of a trained and evaluated member: fitness is its validation pass@1, the
    diagnostics its training log's means plus wall time, steps and every pass@k, ``evaluations`` its extra
    evaluations by name; warns when the regularizer's gradient share is below ``divergence.grad_share_floor`` (a
    0-step run logged none, so it is not warned about)."""
    wall = time.monotonic() - started
    diagnostics = diagnostics_from_history(trainer.state.log_history)
    diagnostics.update({"wall_time_s": wall, "steps_done": float(trainer.state.global_step)})
    diagnostics.update({f"pass_at_{k}": v for k, v in evaluation.pass_at_k.items()})
    warn_if_inert(diagnostics, cfg.divergence.grad_share_floor, str(work_dir))
    fitness = evaluation.pass_at_1 if outcome is None else outcome.fitness  # a truncation's: its change of pass@1
    diagnostics.update(outcome.diagnostics if outcome is not None else {})
    record = ResultRecord(
        status="ok",
        fitness=fitness,
        eval_split=cfg.eval_split,
        val_size=evaluation.size,
        mean_response_tokens=evaluation.mean_response_tokens,
        diagnostics=diagnostics,
        wall_time_s=wall,
        steps_done=trainer.state.global_step,
        disk_peak_bytes=peak_disk(trainer, work_dir),
        evaluations={name: dict(entry) for name, entry in (evaluations or {}).items()},
        generation=trainer.generation_summary(),
        device=with_peak_memory(device) if device else {},
    )
    return write_final_result(work_dir, record)


def record_done(work_dir: Path, outcome: Outcome, started: float) -> ResultRecord:
    """Write and return the record of a member whose segment was closed before it was stopped (a truncation's
    published boundary: the scores it recorded; no trainer was built)."""
    record = ResultRecord(status="ok", fitness=outcome.fitness, wall_time_s=time.monotonic() - started,
                          steps_done=outcome.steps_done, diagnostics=dict(outcome.diagnostics))
    return write_final_result(work_dir, record)
