"""`train_member(spec) -> ResultRecord`: one NM-GRPO training run + validation, idempotent and resumable.

This is the function the ES orchestrator runs for every population member, possibly several times for the
same member (requeue after preemption, retries, orchestrator resume). So: a final result.json is returned as
is, a partial run continues from its newest TRL checkpoint in the work dir, and every way of failing ends in
a written record with a status and a reason - never a NaN fitness. Once the result is final, the member's
checkpoints follow ``train.keep_checkpoints`` (inner_loop/checkpoints.py) and the record carries its peak disk use.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from inner_loop.checkpoints import (CHECKPOINT_DIR, TRASH_DIR, DiskUsageCallback, apply_checkpoint_policy,
                                   dir_bytes, last_checkpoint)
from inner_loop.config import InnerConfig
from inner_loop.evaluate import EvalResult, evaluate
from inner_loop.grpo_args import build_grpo_config, check_grpo_config
from inner_loop.models import format_prompt, load_policy, resolve_model_dir
from inner_loop.policy_terms import PolicyParams
from inner_loop.regularizers import GRAD_SHARE_DIAGNOSTIC, Regularizer, build_regularizer, warn_if_inert
from inner_loop.tasks import build_task, check_disjoint
from inner_loop.tasks.base import Problem, Task
from inner_loop.trainer import MirrorGRPOTrainer, NonFiniteLossError
from inner_loop.warmup import warmed_model_dir
from results.provenance import build_run_manifest, write_run_manifest
from mirror_maps import VECTOR_LENGTH
from results.layout import FINAL_MODEL_DIR  # a single run's trained model, whatever keep_checkpoints says
from results.records import MemberSpec, ResultRecord, read_result, write_result

logger = logging.getLogger(__name__)

#: TRL log keys averaged over the run into the result's diagnostics.
_DIAGNOSTIC_KEYS = {
    "reward": "reward_mean",
    "frac_reward_zero_std": "zero_variance_group_frac",
    "completions/clipped_ratio": "clipped_completion_ratio",
    "regularizer/value": "regularizer_value",
    # ||grad coef*D|| / ||grad policy term||: per step in the space the loss sees, and once exactly w.r.t. the
    # trainable parameters (inner_loop/grad_share.py); a ratio of gradients, since the policy term's VALUE is ~0
    "regularizer/grad_share": GRAD_SHARE_DIAGNOSTIC,
    "regularizer/grad_share_exact": "regularizer_grad_share_exact",
    "regularizer/grad_share_exact_step": "regularizer_grad_share_exact_step",
}
#: Policy-term metrics (clipping, trust-region masks, mean ratio) are kept under their own names.
_POLICY_METRIC_PREFIXES = ("clip_ratio/", "trust_region/")


@dataclass
class PreparedRun:
    """Everything validated and loaded before training starts."""

    cfg: InnerConfig
    task: Task
    train: list[Problem]
    #: the problems the run is scored on: the validation split, or the test split when cfg.eval_split says so
    scored: list[Problem]
    regularizer: Regularizer


def _as_spec(spec: MemberSpec | Mapping[str, Any]) -> MemberSpec:
    if isinstance(spec, MemberSpec):
        return spec
    if isinstance(spec, Mapping):
        return MemberSpec.from_dict(spec)
    raise TypeError(f"train_member expects a MemberSpec or its dict, got {type(spec).__name__}")


def prepare(inner: Mapping[str, Any], seed: int, params: list[float] | None = None) -> PreparedRun:
    """Validate the config, build the regularizer (reads any init file) and load the task's splits; every user
    mistake raises ValueError here, before anything is written."""
    cfg = InnerConfig.from_dict(inner, seed=seed)
    regularizer = build_regularizer(cfg.divergence, params if cfg.divergence.name == "neural_mirror" else None)
    task = build_task(cfg.task)
    if not task.trainable:
        raise ValueError(f"task {task.name!r} is evaluation-only; train on another task (e.g. mbpp)")
    train = task.load("train")
    scored = task.load(cfg.eval_split)
    check_disjoint(task.name, {"train": train, cfg.eval_split: scored})
    if cfg.eval_split == "validation" and cfg.train.val_size is not None:
        scored = scored[: cfg.train.val_size]
    if not train or not scored:
        raise ValueError(f"task {task.name!r}: empty train ({len(train)}) or {cfg.eval_split} ({len(scored)}) split")
    return PreparedRun(cfg, task, train, scored, regularizer)


def _build_trainer(run: PreparedRun, work_dir: Path, seed: int) -> MirrorGRPOTrainer:
    from datasets import Dataset

    cfg, tcfg = run.cfg, run.cfg.train
    # Built first, by the same function as the up-front check: a rejected setting fails before a model is loaded.
    args = build_grpo_config(cfg, work_dir / CHECKPOINT_DIR, seed)
    base = resolve_model_dir(cfg.model)
    if cfg.model.warmup_max_steps:
        base = warmed_model_dir(cfg.model, base, run.task, cfg.task,
                                probe_max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length)
    model, tokenizer = load_policy(cfg.model, base)
    prompts = [format_prompt(tokenizer, p.prompt, cfg.model.chat_template, cfg.model.chat_template_kwargs)
               for p in run.train]
    dataset = Dataset.from_dict({"prompt": prompts, "problem_index": list(range(len(run.train)))})
    task, problems = run.task, run.train

    def reward(prompts: list[str], completions: list[str], problem_index: list[int], **_: Any) -> list[float]:
        return task.score_many([problems[i] for i in problem_index], completions)

    reward.__name__ = f"{task.name}_reward"
    return MirrorGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        regularizer=run.regularizer,
        policy_term=tcfg.policy_loss,
        policy_params=PolicyParams(tcfg.epsilon_low, tcfg.epsilon_high, dict(tcfg.policy_extra)),
        full_form_rows=tcfg.full_form_rows,
        callbacks=[DiskUsageCallback(str(work_dir))],
    )


def diagnostics_from_history(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over the logged steps of each diagnostic (finite values only)."""
    out: dict[str, float] = {}
    policy_keys = sorted({k for h in history for k in h if k.startswith(_POLICY_METRIC_PREFIXES)})
    for key, name in [*_DIAGNOSTIC_KEYS.items(), *((k, k) for k in policy_keys)]:
        values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
        if values:
            out[name] = sum(values) / len(values)
    return out


def _evaluate(trainer: MirrorGRPOTrainer, run: PreparedRun) -> EvalResult:
    tcfg = run.cfg.train
    model = trainer.accelerator.unwrap_model(trainer.model)
    return evaluate(model, trainer.processing_class, run.task, run.scored,
                    max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length,
                    batch_size=tcfg.val_batch_size, chat_template=run.cfg.model.chat_template,
                    chat_template_kwargs=run.cfg.model.chat_template_kwargs, pass_k=tcfg.pass_k, pass_k_samples=tcfg.pass_k_samples,
                    temperature=tcfg.temperature, top_p=tcfg.top_p)


def _save_final_model(trainer: MirrorGRPOTrainer, work_dir: Path) -> Path:
    """Write the trained model (the LoRA adapter when model.lora_r > 0) and tokenizer to ``<work_dir>/final/``.

    Written beside it and renamed into place, so ``final/`` is either absent or whole; it is written before
    result.json, so an ok result of a single run implies its final model is there.
    """
    final, tmp = work_dir / FINAL_MODEL_DIR, work_dir / f".{FINAL_MODEL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _peak_disk(trainer: MirrorGRPOTrainer, work_dir: Path) -> int | None:
    """Peak bytes of the work dir: the max over checkpoint saves (the callback) and the dir as it is now; None
    if the filesystem would not say (a diagnostic must never turn a finished member into a failed one)."""
    tracker = next((c for c in trainer.callback_handler.callbacks if isinstance(c, DiskUsageCallback)), None)
    try:
        return tracker.measure() if tracker is not None else dir_bytes(work_dir)
    except OSError as exc:
        logger.warning("member %s: could not measure its disk use: %s", work_dir, exc)
        return None


def _apply_policy(work_dir: Path, keep: str) -> None:
    """Delete what ``keep`` does not keep, after the result is final. A filesystem error here (an NFS server
    refusing to drop a busy file) is logged, never raised: raising would turn a finished member into a failed
    one; whatever is left goes on the next call."""
    try:
        apply_checkpoint_policy(work_dir, keep)
    except OSError as exc:
        logger.warning("member %s: could not delete its checkpoints (keep_checkpoints=%s): %s; the next call "
                       "retries", work_dir, keep, exc)


def _clean_up_after_final(spec: MemberSpec, work_dir: Path) -> None:
    """Apply train.keep_checkpoints to a member whose result.json was already final when we were called: what a
    crash between writing the result and deleting the checkpoints (or a failed member's kept ones) leaves."""
    if not any((work_dir / name).exists() for name in (CHECKPOINT_DIR, TRASH_DIR)):
        return
    try:
        keep = InnerConfig.from_dict(spec.inner, seed=spec.seed).train.keep_checkpoints
    except ValueError as exc:
        logger.warning("member %s: leaving its checkpoints, its config no longer parses (%s)", work_dir, exc)
        return
    _apply_policy(work_dir, keep)


def _record_failure(work_dir: Path, stage: str, exc: Exception, trainer: MirrorGRPOTrainer | None,
                    started: float) -> ResultRecord:
    """Write and return the `failed` record of a member that raised in ``stage``, with what it got done (steps,
    diagnostics, disk) where a trainer exists. Called inside the ``except`` block (it logs the traceback)."""
    if isinstance(exc, NonFiniteLossError):  # an outcome of the mirror map, not a bug: no traceback
        logger.warning("member %s failed in %s: %s", work_dir, stage, exc)
        reason = str(exc)
    else:
        logger.error("member %s failed in %s:\n%s", work_dir, stage, traceback.format_exc())
        reason = f"{type(exc).__name__}: {exc}"
    work_dir.mkdir(parents=True, exist_ok=True)
    record = ResultRecord(
        status="failed", error=f"{stage}: {reason}", wall_time_s=time.monotonic() - started,
        steps_done=trainer.state.global_step if trainer is not None else 0,
        diagnostics=diagnostics_from_history(trainer.state.log_history) if trainer is not None else {},
        disk_peak_bytes=_peak_disk(trainer, work_dir) if trainer is not None else None,
    )
    write_result(work_dir, record)
    return record


def train_member(spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> ResultRecord:
    """Train and validate one member; returns (and writes to ``<work_dir>/result.json``) its ResultRecord.

    Every failure, from parsing the config to loading the model, training, evaluating and saving, is written and
    returned as status `failed` with the stage and the reason (a member must never end its job without a record);
    config and data mistakes are caught before any job is submitted by ``validate_inner``, which raises instead.
    ``save_final``: also keep the trained model in ``<work_dir>/final/`` (single runs want it; an ES member's
    outcome is its record).

    Checkpoints follow ``train.keep_checkpoints``, applied only AFTER result.json is durably written (a crash in
    between loses nothing: the next call finds the final result and finishes the cleanup). A failed member
    keeps its checkpoints: the orchestrator may retry it, and the retry resumes from them.
    """
    spec = _as_spec(spec)
    work_dir = Path(spec.work_dir)
    existing = read_result(work_dir)
    if existing is not None:
        logger.info("member %s: final result already present, returning it", work_dir)
        _clean_up_after_final(spec, work_dir)
        if save_final and existing.ok and not (work_dir / FINAL_MODEL_DIR).is_dir():
            logger.warning("member %s: finished without a %s/ model (trained by an ES run or an older version)",
                           work_dir, FINAL_MODEL_DIR)
        return existing
    started = time.monotonic()
    trainer: MirrorGRPOTrainer | None = None
    stage = "config and data"
    try:
        run = prepare(spec.inner, spec.seed, spec.params)
        stage = "setup"
        torch.set_num_threads(run.cfg.train.num_threads)
        work_dir.mkdir(parents=True, exist_ok=True)
        write_run_manifest(work_dir, build_run_manifest(run_id=spec.run_id, seed=spec.seed, inner=spec.inner,
                                                        splits={"train": run.train,
                                                                run.cfg.eval_split: run.scored},
                                                        params=spec.params))
        stage = "model and trainer setup"
        trainer = _build_trainer(run, work_dir, spec.seed)
        resume = last_checkpoint(work_dir)
        if resume:
            logger.info("member %s: resuming from %s", work_dir, resume)
        stage = "training"
        trainer.train(resume_from_checkpoint=resume)
        stage = "evaluation"
        evaluation = _evaluate(trainer, run)
        if save_final:
            stage = "saving the final model"
            _save_final_model(trainer, work_dir)
    except Exception as exc:  # a failure is a member outcome with a record, not an orchestrator crash
        return _record_failure(work_dir, stage, exc, trainer, started)
    wall = time.monotonic() - started
    diagnostics = diagnostics_from_history(trainer.state.log_history)
    diagnostics.update({"wall_time_s": wall, "steps_done": float(trainer.state.global_step)})
    diagnostics.update({f"pass_at_{k}": v for k, v in evaluation.pass_at_k.items()})
    warn_if_inert(diagnostics, run.cfg.divergence.grad_share_floor, str(work_dir))
    record = ResultRecord(
        status="ok",
        fitness=evaluation.pass_at_1,
        eval_split=run.cfg.eval_split,
        val_size=evaluation.size,
        mean_response_tokens=evaluation.mean_response_tokens,
        diagnostics=diagnostics,
        wall_time_s=wall,
        steps_done=trainer.state.global_step,
        disk_peak_bytes=_peak_disk(trainer, work_dir),
    )
    write_result(work_dir, record)
    _apply_policy(work_dir, run.cfg.train.keep_checkpoints)
    logger.info("member %s: fitness %.4f after %d steps in %.1fs, peak disk %s bytes", work_dir, record.fitness,
                record.steps_done, wall, record.disk_peak_bytes)
    return record


def validate_inner(inner: Mapping[str, Any]) -> None:
    """Check a member's inner config and data up front (ValueError naming the key), training nothing.

    Attached to `train_member` as `.validate`, so the orchestrator rejects a bad task/model/divergence/train
    config before it submits a single job, without knowing anything about LLMs.
    """
    divergence = inner.get("divergence") or {}
    # With an init file, validate that file; otherwise stand-in numbers (members bring their own vector).
    params = None if divergence.get("init") else [0.0] * VECTOR_LENGTH
    run = prepare(inner, seed=0, params=params)
    check_grpo_config(run.cfg)  # every value that reaches TRL's GRPOConfig (lr_scheduler, train.trl, ...)


def finalize_member(spec: MemberSpec | Mapping[str, Any]) -> None:
    """Apply train.keep_checkpoints to a member the search has settled for good (its last attempt failed or
    timed out: train_member keeps a failed member's checkpoints for a retry, and a settled member is never
    called again, so without this they would stay). Nothing happens before a final result.json exists."""
    spec = _as_spec(spec)
    work_dir = Path(spec.work_dir)
    if read_result(work_dir) is not None:
        _clean_up_after_final(spec, work_dir)


train_member.validate = validate_inner  # type: ignore[attr-defined]
train_member.finalize = finalize_member  # type: ignore[attr-defined]
