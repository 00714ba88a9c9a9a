"""Everything a member run needs before its first step: the validated config, the task's splits, the regularizer,
then the model and the trainer.

Split in two on purpose: ``prepare`` reads config and data only (cheap; the orchestrator runs it for
``validate_inner`` before submitting any job), ``build_trainer`` loads the model (expensive; in the member's job).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from inner_loop.config import ExtraEvaluation, InnerConfig
from inner_loop.grpo.args import check_grpo_config
from inner_loop.loss.divergences import divergence
from inner_loop.loss.regularizers import Regularizer, build_regularizer
from inner_loop.tasks import build_task, check_disjoint, check_transfer
from inner_loop.tasks.base import Problem, Task
from mirror_maps import VECTOR_LENGTH

if TYPE_CHECKING:
    from inner_loop.grpo.trainer import MirrorGRPOTrainer


@dataclass
class ExtraRun:
    """One of cfg.extra_evaluations, ready to score: its name, its task and that task's test problems."""

    name: str
    task: Task
    problems: list[Problem]


@dataclass
class PreparedRun:
    """Everything validated and loaded before training starts."""

    cfg: InnerConfig
    task: Task
    train: list[Problem]
    #: the problems the run is scored on: the validation split, or the test split when cfg.eval_split says so
    scored: list[Problem]
    regularizer: Regularizer
    #: scored after the fitness on the same model, in cfg.extra_evaluations' order
    extras: list[ExtraRun] = field(default_factory=list)


def _task_key(index: int, extra: ExtraEvaluation) -> str:
    """How the node of an extra evaluation is spelled: the run's own ``task`` or ``extra_evaluations[i].task``."""
    return "task" if extra.task is None else f"extra_evaluations[{index}].task"


def _renamed(message: str, index: int, extra: ExtraEvaluation) -> str:
    """A task package message about ``task.<key>`` as one about the node the extra evaluation named."""
    return f"extra_evaluations[{index}]: " + re.sub(r"(?<![\w.\[])task\.(?=\w)", _task_key(index, extra) + ".",
                                                    message)


def _prepare_extra(index: int, extra: ExtraEvaluation, own: Task, train: list[Problem]) -> ExtraRun:
    """The task and test problems of one extra evaluation, loaded like the run's own (same loaders, offline
    where the node says so); a transfer test set sharing a prompt with the training split is refused."""
    try:
        task = own if extra.task is None else build_task(extra.task)
        if extra.task is not None:
            check_transfer(task)
        problems = task.load("test")
        check_disjoint(task.name, {"train": train, "test": problems})
    except ValueError as exc:
        raise ValueError(_renamed(str(exc), index, extra)) from exc
    if not problems:
        raise ValueError(f"extra_evaluations[{index}]: task {task.name!r} has an empty test split; raise "
                         f"{_task_key(index, extra)}.test_size")
    return ExtraRun(extra.name, task, problems)


def prepare(inner: Mapping[str, Any], seed: int, params: list[float] | None = None) -> PreparedRun:
    """Validate the config, build the regularizer (reads any init file) and load the task's splits; every user
    mistake raises ValueError here, before anything is written."""
    cfg = InnerConfig.from_dict(inner, seed=seed)
    regularizer = build_regularizer(cfg.divergence, params if divergence(cfg.divergence.name).learned_map else None)
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
    extras = [_prepare_extra(i, extra, task, train) for i, extra in enumerate(cfg.extra_evaluations)]
    return PreparedRun(cfg, task, train, scored, regularizer, extras)


def validate_inner(inner: Mapping[str, Any]) -> None:
    """Check a member's inner config and data up front (ValueError naming the key), training nothing.

    The member program's ``validate`` (inner_loop/member/entry.py), so the orchestrator rejects a bad
    task/model/divergence/train config before it submits a single job, without knowing anything about LLMs.
    """
    divergence = inner.get("divergence") or {}
    # With an init file, validate that file; otherwise stand-in numbers (members bring their own vector).
    params = None if divergence.get("init") else [0.0] * VECTOR_LENGTH
    run = prepare(inner, seed=0, params=params)
    check_grpo_config(run.cfg)  # every value that reaches TRL's GRPOConfig (lr_scheduler, train.trl, ...)


def build_trainer(run: PreparedRun, work_dir: Path, seed: int) -> MirrorGRPOTrainer:
    """The member's trainer: its GRPOConfig, the (warmed) policy, the formatted train prompts and the reward."""
    # Imported here, not at the top: the trainer's stack (TRL's trainer, PEFT, and vLLM whenever it is installed) costs
    # seconds per process, which ``prepare``/``validate_inner`` (an orchestrator's up-front check, a refused command
    # line) never use.
    import torch
    from datasets import Dataset

    from inner_loop.generation.backends import generation_backend
    from inner_loop.generation.continuous_batching import member_continuous_batching_config
    from inner_loop.generation.decode_step import member_decode_buckets
    from inner_loop.generation.memory import member_gpu_budget_bytes
    from inner_loop.generation.vllm_colocate import member_vllm_max_model_length
    from inner_loop.grpo.args import build_grpo_config
    from inner_loop.grpo.trainer import MirrorGRPOTrainer
    from inner_loop.loss.policy_terms import PolicyParams
    from inner_loop.models.loading import load_policy, resolve_model_dir
    from inner_loop.models.prompts import format_prompt
    from inner_loop.process.gpu_share import engine_start_turn_for
    from inner_loop.training.checkpoints import CHECKPOINT_DIR
    from inner_loop.training.callbacks import (DiskUsageCallback, ProgressFileCallback, SaveOnNoticeCallback,
                                               tensorboard_callback)
    from inner_loop.training.warmup import warmed_model_dir

    cfg, tcfg = run.cfg, run.cfg.train
    # Built first, by the same function as the up-front check: a rejected setting fails before a model is loaded.
    args = build_grpo_config(cfg, work_dir / CHECKPOINT_DIR, seed)
    base = resolve_model_dir(cfg.model)
    if cfg.model.warmup_max_steps:
        base = warmed_model_dir(cfg.model, base, run.task, cfg.task,
                                probe_max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length)
    model, tokenizer = load_policy(cfg.model, base, seed)
    prompts = [format_prompt(tokenizer, p.prompt, cfg.model.chat_template, cfg.model.chat_template_kwargs)
               for p in run.train]
    dataset = Dataset.from_dict({"prompt": prompts, "problem_index": list(range(len(run.train)))})
    gpu_budget = None
    if args.device.type == "cuda":  # the member's share of its GPU, never what the device has free
        gpu_budget = member_gpu_budget_bytes(torch.cuda.get_device_properties(args.device).total_memory,
                                             cfg.gpu_memory_fraction)
    if args.use_transformers_continuous_batching:  # a paged cache sized from this member's memory, not the node's
        args.transformers_continuous_batching_config = member_continuous_batching_config(args, model, tokenizer,
                                                                                         prompts, gpu_budget)
    args.vllm_max_model_length = member_vllm_max_model_length(args, tokenizer, prompts)  # not the model's context
    task, problems = run.task, run.train

    def reward(prompts: list[str], completions: list[str], problem_index: list[int], **_: Any) -> list[float]:
        return task.score_many([problems[i] for i in problem_index], completions)

    reward.__name__ = f"{task.name}_reward"
    # members sharing the card build their vLLM engines one at a time (vLLM sizes its cache from the whole device)
    with engine_start_turn_for(generation_backend(vars(args)), args.device, cfg.members_per_gpu):
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
            gpu_budget_bytes=gpu_budget,
            decode_cache=tcfg.decode_cache,
            decode_buckets=member_decode_buckets(tcfg.decode_cache, tcfg.decode_buckets, tokenizer, prompts),
            decode_compile_backend=tcfg.decode_compile_backend,
            decode_windows=tcfg.decode_windows,
            callbacks=[DiskUsageCallback(str(work_dir)), ProgressFileCallback(work_dir),
                       *([tensorboard_callback(work_dir)] if "tensorboard" in tcfg.report_to else []),
                       SaveOnNoticeCallback()],  # last: the others see its save before it stops the run
        )
