"""Validation: greedy pass@1 (the ES fitness), mean response length in tokens, optional unbiased pass@k.

Prompts go through the same `format_prompt` as training and completions through the task's own `solved`, so the
fitness and the training reward agree by construction.

Also the door of ``python -m inner_loop.evaluate work_dir=<finished run> task=<group> [task.<key>=<value> ...]``:
a finished run's model scored on a task's test split afterwards (the finished-run side is inner_loop/training/transfer.py).
"""
from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from inner_loop.models.prompts import eos_token_ids, format_prompt
from inner_loop.tasks.base import Problem, Task

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Outcome of one validation pass."""

    pass_at_1: float
    size: int
    mean_response_tokens: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    completions: list[str] = field(default_factory=list)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) of P(at least one of k samples is correct), c of n correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Product form avoids huge binomials: C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i).
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _response_lengths(generated: torch.Tensor, eos_ids: Sequence[int], pad_id: int | None) -> list[int]:
    """Tokens up to and including the first of any eos id (or all generated tokens if none), padding excluded."""
    stop = set(eos_ids)
    lengths = []
    for row in generated.tolist():
        length = 0
        for token in row:
            if token in stop:
                length += 1
                break
            if token == pad_id and pad_id not in stop:
                break
            length += 1
        lengths.append(length)
    return lengths


def encode_prompts(tokenizer, texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """Left-padded prompt ids, tokenized the way TRL's GRPOTrainer tokenizes plain-string prompts
    (`processing_class(text=prompts)`, i.e. with the tokenizer's special tokens), so evaluation feeds the model
    the ids training did."""
    tokenizer.padding_side = "left"
    return tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=True)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, batch_size: int, chat_template: bool,
             do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
             chat_template_kwargs: Mapping[str, Any] | None = None) -> tuple[list[str], list[int]]:
    """Completions (decoded, special tokens dropped) and their token lengths, in batches, left padding."""
    was_training = model.training
    model.eval()
    stop = eos_token_ids(model, tokenizer)
    texts, lengths = [], []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = [format_prompt(tokenizer, p, chat_template, chat_template_kwargs)
                     for p in prompts[start : start + batch_size]]
            enc = encode_prompts(tokenizer, chunk).to(model.device)
            kwargs = {"do_sample": True, "temperature": temperature, "top_p": top_p} if do_sample else {
                "do_sample": False}
            out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=stop, **kwargs)
            generated = out[:, enc["input_ids"].shape[1]:]
            texts.extend(tokenizer.batch_decode(generated, skip_special_tokens=True))
            lengths.extend(_response_lengths(generated, stop, tokenizer.pad_token_id))
    finally:
        model.train(was_training)
    return texts, lengths


def evaluate(model, tokenizer, task: Task, problems: Sequence[Problem], max_new_tokens: int, batch_size: int = 64,
             chat_template: bool = False, pass_k: Sequence[int] = (), pass_k_samples: int = 0,
             temperature: float = 1.0, top_p: float = 1.0, log: bool = True,
             chat_template_kwargs: Mapping[str, Any] | None = None) -> EvalResult:
    """Greedy pass@1 over ``problems`` (one sample each); pass@k from ``pass_k_samples`` sampled completions.

    ``log=False`` keeps frequent internal checks (the warm-up's probe) out of the log."""
    if not problems:
        raise ValueError(f"task {task.name!r}: the validation split is empty; raise its validation size")
    prompts = [p.prompt for p in problems]
    texts, lengths = generate(model, tokenizer, prompts, max_new_tokens, batch_size, chat_template,
                              chat_template_kwargs=chat_template_kwargs)
    solved = task.solved_many(problems, texts)
    result = EvalResult(
        pass_at_1=sum(solved) / len(problems),
        size=len(problems),
        mean_response_tokens=sum(lengths) / len(lengths),
        completions=texts,
    )
    if pass_k:
        repeated = [p for p in problems for _ in range(pass_k_samples)]
        samples, _ = generate(model, tokenizer, [p.prompt for p in repeated], max_new_tokens, batch_size,
                              chat_template, do_sample=True, temperature=temperature, top_p=top_p,
                              chat_template_kwargs=chat_template_kwargs)
        ok = task.solved_many(repeated, samples)
        correct = [sum(ok[i * pass_k_samples : (i + 1) * pass_k_samples]) for i in range(len(problems))]
        for k in pass_k:
            result.pass_at_k[k] = sum(pass_at_k(pass_k_samples, c, k) for c in correct) / len(problems)
    if log:
        logger.info("validation: pass@1 %.4f on %d problems, mean response %.1f tokens", result.pass_at_1,
                    result.size, result.mean_response_tokens)
    return result


def evaluation_entry(task_name: str, result: EvalResult, split: str = "test") -> dict[str, Any]:
    """One extra evaluation as a result record's ``evaluations`` holds it (and an evaluation file starts with):
    built in one place so the in-run entries and the ones written afterwards cannot differ in their fields."""
    return {"task": task_name, "split": split, "pass_at_1": result.pass_at_1, "size": result.size,
            "mean_response_tokens": result.mean_response_tokens}


def main(argv: Sequence[str] | None = None) -> int:
    """Score a finished run's model on a task's test split; 0 with the record written, 2 for bad input (one line,
    before any model is loaded)."""
    from inner_loop.training.transfer import UsageError, load_run_model, plan_evaluation, write_evaluation

    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "INFO"),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        plan = plan_evaluation(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        logger.error("error: %s", exc)
        return 2
    model, tokenizer = load_run_model(plan.run)
    train, model_cfg = plan.run.train, plan.run.model
    result = evaluate(model, tokenizer, plan.task, plan.problems,
                      max_new_tokens=train.val_max_new_tokens or train.max_completion_length,
                      batch_size=train.val_batch_size, chat_template=model_cfg.chat_template,
                      chat_template_kwargs=model_cfg.chat_template_kwargs, log=False)
    path = write_evaluation(plan, evaluation_entry(plan.task.name, result))
    logger.info("%s on %s test: pass@1 %.4f on %d problems, mean response %.1f tokens (%s); wrote %s",
                plan.run.work_dir, plan.task.name, result.pass_at_1, result.size, result.mean_response_tokens,
                plan.run.model_source, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
