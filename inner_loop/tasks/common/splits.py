"""Carving train / validation / test out of a dataset's training pool and test split.

The fitness of a population member is its validation pass@1, so validation must be unseen during training.
The authors' GSM8K code trained on the first 80% of the (unshuffled) training split and validated on a
shuffled 20% of the same split, which overlaps. Here validation is a seeded random subset of the training
pool, training uses only the rest, duplicates are removed first (a duplicated question would otherwise land
on both sides) and the result is checked by prompt hash.
"""
from __future__ import annotations

import logging
import random
from typing import Mapping, Sequence

from inner_loop.tasks.base import Problem, check_disjoint, prompt_hash

logger = logging.getLogger(__name__)


def dedupe(task_name: str, label: str, problems: Sequence[Problem]) -> list[Problem]:
    """Drop later problems whose prompt repeats an earlier one (after whitespace normalisation)."""
    seen: set[str] = set()
    kept = []
    for problem in problems:
        key = prompt_hash(problem.prompt)
        if key not in seen:
            seen.add(key)
            kept.append(problem)
    if len(kept) < len(problems):
        logger.warning("task %s: dropped %d duplicated prompt(s) from the %s data", task_name,
                       len(problems) - len(kept), label)
    return kept


def carve_splits(
    task_name: str,
    pool: Sequence[Problem],
    test: Sequence[Problem] | None,
    *,
    validation_size: int,
    train_size: int | None,
    test_size: int | None,
    seed: int,
    log: bool = True,
) -> dict[str, list[Problem]]:
    """Split ``pool`` into disjoint train / validation (seeded shuffle) and cut ``test`` to size.

    ``train_size`` / ``test_size`` None means "all that is left". Pool prompts that also occur in the test
    data are dropped (logged): they would leak test problems into training.
    """
    pool = dedupe(task_name, "training", pool)
    splits: dict[str, list[Problem]] = {}
    if test is not None:
        test = dedupe(task_name, "test", test)
        test_hashes = {prompt_hash(p.prompt) for p in test}
        clean = [p for p in pool if prompt_hash(p.prompt) not in test_hashes]
        if len(clean) < len(pool):
            logger.warning("task %s: dropped %d training prompt(s) that also appear in the test data",
                           task_name, len(pool) - len(clean))
        pool = clean
        if test_size is not None and test_size > len(test):
            raise ValueError(
                f"task {task_name!r}: task.test_size={test_size} but the test data has only {len(test)} "
                f"problems; lower task.test_size or set it to null for all"
            )
        splits["test"] = list(test if test_size is None else test[:test_size])
    if validation_size >= len(pool):
        raise ValueError(
            f"task {task_name!r}: task.validation_size={validation_size} leaves no training data (the training "
            f"pool has {len(pool)} unique problems); lower task.validation_size"
        )
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    validation = [pool[i] for i in order[:validation_size]]
    rest = [pool[i] for i in order[validation_size:]]
    if train_size is not None and train_size > len(rest):
        raise ValueError(
            f"task {task_name!r}: task.train_size={train_size} but only {len(rest)} problems remain after "
            f"carving task.validation_size={validation_size}; lower task.train_size or set it to null for all"
        )
    splits["train"] = rest if train_size is None else rest[:train_size]
    splits["validation"] = validation
    check_disjoint(task_name, splits)
    if log:
        log_splits(task_name, splits)
    return splits


_LOGGED: set[str] = set()


def log_splits(task_name: str, splits: Mapping[str, Sequence[Problem]], note: str = "") -> None:
    """One line of the split sizes, once per process for the same line: a dry run builds the task for every run
    configuration it checks, and the sizes are the same each time."""
    line = f"task {task_name}: " + ", ".join(f"{k}={len(v)}" for k, v in splits.items()) + note
    if line not in _LOGGED:
        _LOGGED.add(line)
        logger.info("%s", line)
