"""Intermediate validation while a member trains: pass@1 every ``train.eval_every`` steps, for a tuner's pruner.

Scored greedily on the first ``train.eval_subset`` problems of the validation split (the same problems at every
step, the start of the set the final fitness is scored on), so successive values are comparable and cheap; the
final step is left to the full validation that follows training. Each value is appended to the member's
intermediate.jsonl (results/store/member_files.py), which ``python -m meta.tune`` reads while the member runs.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from results.store.member_files import append_intermediate

logger = logging.getLogger(__name__)


class IntermediateEvalCallback(TrainerCallback):
    """Calls ``score()`` -> (pass@1, problems scored) at every ``every``-th step before the last and appends it."""

    def __init__(self, work_dir: str | Path, every: int, score: Callable[[], tuple[float, int]]) -> None:
        self.work_dir = Path(work_dir)
        self.every = every
        self.score = score

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        step = int(state.global_step)
        if step % self.every or step >= int(state.max_steps):
            return
        value, size = self.score()
        try:
            append_intermediate(self.work_dir, step, value, size)
        except OSError as exc:  # the pruner loses one value; training goes on
            logger.warning("could not write the intermediate validation of step %d in %s: %s", step, self.work_dir, exc)
            return
        logger.info("member %s: step %d intermediate validation pass@1 %.4f (%d problems)", self.work_dir, step,
                    value, size)
