"""`train_in_process(spec) -> ResultRecord`: one NM-GRPO training run + validation, in this process, idempotent and
resumable.

This is what the member program (inner_loop/member/entry.py) runs for every population member, possibly several
times for the same member (requeue after preemption, retries, orchestrator resume). So: a final result.json is
returned as is, a partial run continues from its newest TRL checkpoint in the work dir, and every way of failing
ends in a written record with a status and a reason - never a NaN fitness. Once the result is final, the member's
checkpoints follow ``train.keep_checkpoints`` (inner_loop/training/checkpoints.py) and the record carries its peak
disk use.

This module is the lifecycle only, readable top to bottom; each step's work lives in its own module:
run_setup (config, data, trainer), checkpoints (resume and cleanup), member_records (the result record),
final_model (a single run's trained model).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

import torch

import inner_loop.process.pinned as numerics
import inner_loop.process.notice as notice
from inner_loop.training.checkpoints import settle_after_final, settle_checkpoints
from inner_loop.member.device import DeviceUnavailableError, require_device
from inner_loop.training.evaluate import EvalResult, evaluate, evaluation_entry
from inner_loop.training.final_model import save_final_model
from inner_loop.process.gpu_share import apply_memory_share
from inner_loop.training.intermediate_eval import IntermediateEvalCallback
from inner_loop.member.records import record_done, record_failure, record_success
from inner_loop.member.preflight import record_node_failure, run_preflight
from inner_loop.training.setup import ExtraRun, PreparedRun, build_trainer, prepare
from inner_loop.training.truncation import continuation, load_trained
from inner_loop.grpo.trainer import MirrorGRPOTrainer
from inner_loop.loss.divergences import divergence
from results.store.gpu_share import read_gpu_share
from results.store.layout import FINAL_MODEL_DIR  # a single run's trained model, whatever keep_checkpoints says
from results.store.provenance import build_run_manifest, write_run_manifest
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result

logger = logging.getLogger(__name__)


def _as_spec(spec: MemberSpec | Mapping[str, Any]) -> MemberSpec:
    if isinstance(spec, MemberSpec):
        return spec
    if isinstance(spec, Mapping):
        return MemberSpec.from_dict(spec)
    raise TypeError(f"a member expects a MemberSpec or its dict, got {type(spec).__name__}")


def _numerics_for(run: PreparedRun) -> dict[str, Any]:
    """The CPU numerics this member computes with (named in its run manifest). A pinned config reaches here in
    a pinned process through inner_loop.member.entry; called directly from a process with other numerics, it
    runs with those, and says so."""
    if run.cfg.model.cpu_numerics == "pinned" and numerics.can_pin():
        if numerics.pinned_in_force():
            return numerics.enter_pinned().as_dict()
        logger.warning("model.cpu_numerics=pinned, but this process was started with other numerics (call "
                       "inner_loop.member.entry.program to train in a pinned process): its numbers are this "
                       "machine's own")
    return numerics.in_force().as_dict()


def _evaluate(trainer: MirrorGRPOTrainer, run: PreparedRun, subset: int | None = None) -> EvalResult:
    """The run's validation (or test) pass@1; ``subset``: greedy pass@1 alone on the first ``subset`` problems."""
    tcfg = run.cfg.train
    model = trainer.accelerator.unwrap_model(trainer.model)
    problems = run.scored if subset is None else run.scored[:subset]
    return evaluate(model, trainer.processing_class, run.task, problems,
                    max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length,
                    batch_size=tcfg.val_batch_size, chat_template=run.cfg.model.chat_template,
                    chat_template_kwargs=run.cfg.model.chat_template_kwargs,
                    pass_k=tcfg.pass_k if subset is None else [],
                    pass_k_samples=tcfg.pass_k_samples if subset is None else 0,
                    temperature=tcfg.temperature, top_p=tcfg.top_p)


def _evaluate_extra(trainer: MirrorGRPOTrainer, run: PreparedRun, extra: ExtraRun) -> dict[str, Any]:
    """One of the run's extra evaluations on the same model: greedy pass@1 on its task's test split, as the
    entry the record keeps under its name."""
    tcfg = run.cfg.train
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = evaluate(model, trainer.processing_class, extra.task, extra.problems,
                      max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length,
                      batch_size=tcfg.val_batch_size, chat_template=run.cfg.model.chat_template,
                      chat_template_kwargs=run.cfg.model.chat_template_kwargs, log=False)
    logger.info("extra evaluation %r: pass@1 %.4f on %d %s test problems, mean response %.1f tokens", extra.name,
                result.pass_at_1, result.size, extra.task.name, result.mean_response_tokens)
    return evaluation_entry(extra.task.name, result)


def _intermediate_eval(trainer: MirrorGRPOTrainer, run: PreparedRun, work_dir: Path) -> IntermediateEvalCallback:
    def score() -> tuple[float, int]:
        result = _evaluate(trainer, run, subset=run.cfg.train.eval_subset)
        return result.pass_at_1, result.size

    return IntermediateEvalCallback(work_dir, int(run.cfg.train.eval_every or 0), score)


def train_in_process(spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> ResultRecord:
    """Train and validate one member; returns (and writes to ``<work_dir>/result.json``) its ResultRecord.

    Every failure, from parsing the config to loading the model, training, evaluating and saving, is written and
    returned as status `failed` with the stage and the reason (a member must never end its job without a record);
    config and data mistakes are caught before any job is submitted by ``validate_inner``, which raises instead.
    ``save_final``: also keep the trained model in ``<work_dir>/final/`` (single runs want it; an ES member's
    outcome is its record). After the fitness, the inner config's ``extra_evaluations`` are scored on the same
    model into ``record.evaluations``; ``train.steps=0`` trains nothing and scores the untouched model (a
    base-model row of a result table).

    Checkpoints follow ``train.keep_checkpoints``, applied only AFTER result.json is durably written (a crash in
    between loses nothing: the next call finds the final result and finishes the cleanup). A failed member
    keeps its checkpoints: the orchestrator may retry it, and the retry resumes from them.
    """
    spec = _as_spec(spec)
    work_dir = Path(spec.work_dir)
    existing = read_result(work_dir)
    if existing is not None:
        logger.info("member %s: final result already present, returning it", work_dir)
        settle_after_final(work_dir, spec.inner, spec.seed)
        if save_final and existing.ok and not (work_dir / FINAL_MODEL_DIR).is_dir():
            logger.warning("member %s: finished without a %s/ model (trained by an ES run or an older version)",
                           work_dir, FINAL_MODEL_DIR)
        return existing
    # This node's own checks, before any data or model is read; a failure ends the job without a result (the
    # launcher resubmits it and the init is not charged): inner_loop/member/preflight.py
    run_preflight(spec.inner, work_dir)
    started = time.monotonic()
    segment = spec.work  # the steps the generation gave this member (core/records.py: Segment)
    run_of = continuation(spec, work_dir)  # a run of its own, or an es=nres particle's run it continues
    if (done := run_of.done_already(spec.generation)) is not None:
        return record_done(work_dir, done, started)
    trainer: MirrorGRPOTrainer | None = None
    device: dict[str, Any] = {}
    stage = "config and data"
    try:
        run = prepare(spec.inner, spec.seed, spec.params)
        if segment.horizon != run.cfg.train.steps:
            raise ValueError(f"the member's segment spans a schedule of {segment.horizon} steps, its train.steps is "
                             f"{run.cfg.train.steps}: a segment's steps follow its run's schedule")
        logger.info("member %s: task %s, %d training problems, scored on %d %s problems; reward: %s", work_dir,
                    run.task.name, len(run.train), len(run.scored), run.cfg.eval_split,
                    run.task.reward or "(undeclared)")
        stage = "setup"
        try:
            device = require_device(spec.inner)  # a GPU member without a usable GPU ends here, before the model loads
        except DeviceUnavailableError as exc:
            record_node_failure(work_dir, str(exc))  # as a failed pre-flight: the launcher excludes the node
            raise
        share = read_gpu_share(work_dir) or {}  # the launcher's record of the card's other members
        device = apply_memory_share(device, run.cfg.gpu_memory_fraction, run.cfg.members_per_gpu,
                                    share.get("shared_with"))  # before the model loads
        torch.set_num_threads(run.cfg.train.num_threads)
        numerics_used = _numerics_for(run)
        work_dir.mkdir(parents=True, exist_ok=True)
        write_run_manifest(work_dir, build_run_manifest(run_id=spec.run_id, seed=spec.seed, inner=spec.inner,
                                                        splits={"train": run.train,
                                                                run.cfg.eval_split: run.scored},
                                                        params=spec.params, numerics=numerics_used,
                                                        length_reference=divergence(
                                                            run.cfg.divergence.name).length_reference))
        stage = "model and trainer setup"
        trainer = build_trainer(run, work_dir, spec.seed)
        if segment.steps:
            if run.cfg.train.eval_every:
                trainer.add_callback(_intermediate_eval(trainer, run, work_dir))
            stage = run_of.start_stage
            resume = run_of.start(trainer, lambda: _evaluate(trainer, run).pass_at_1)
            if run_of.trained_already(resume):
                logger.info("member %s: its checkpoint at step %d is saved already; closing its segment untrained "
                            "further", work_dir, segment.stop)
                load_trained(trainer, resume)
            else:
                if resume:
                    logger.info("member %s: resuming from %s", work_dir, resume)
                stage = "training"
                try:
                    trainer.train(resume_from_checkpoint=resume)
                finally:
                    notice.training(False)  # a later notice to this process is not waited for
        else:  # a base-model row: the Trainer would read max_steps=0 as "train by epochs", so it is not started
            logger.info("member %s: train.steps=0, scoring the untouched model", work_dir)
        stage = "evaluation"
        evaluation = _evaluate(trainer, run)
        evaluations: dict[str, dict[str, Any]] = {}
        for extra in run.extras:
            stage = f"extra evaluation {extra.name!r}"
            evaluations[extra.name] = _evaluate_extra(trainer, run, extra)
        if save_final:
            stage = "saving the final model"
            save_final_model(trainer, work_dir)
        stage = run_of.finish_stage
        outcome = run_of.finish(evaluation.pass_at_1, spec.generation)
    except Exception as exc:  # a failure is a member outcome with a record, not an orchestrator crash
        return record_failure(work_dir, stage, exc, trainer, started, device)
    record = record_success(work_dir, run.cfg, trainer, evaluation, started, evaluations, device, outcome)
    settle_checkpoints(work_dir, run.cfg.train.keep_checkpoints)
    logger.info("member %s: fitness %.4f after %d steps in %.1fs, peak disk %s bytes", work_dir, record.fitness,
                record.steps_done, record.wall_time_s, record.disk_peak_bytes)
    return record
