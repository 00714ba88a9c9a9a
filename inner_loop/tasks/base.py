"""The task interface shared by the trainer, the evaluator and the task implementations.

A task turns a data source into `Problem`s for three disjoint splits and scores completions. The trainer only
sees prompts and a reward function; evaluation only sees `solved`. Keeping scoring in one place makes the
training reward and the validation pass@1 agree by construction.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from results.store.provenance import (prompt_hash)  # defined in results/ (which must not import inner_loop); re-exported

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Problem:
    """One prompt with what is needed to score a completion of it."""

    id: str
    prompt: str
    answer: str = ""
    tests: tuple[str, ...] = ()
    entry_point: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


class Task(abc.ABC):
    """Base class: subclasses implement `load` and `score`; the rest is shared. A task class declares what the rest
    of the code asks about it (docs/extending.md); the registry (inner_loop/tasks/__init__.py) reads these."""

    name: str = "task"
    #: the dataclass whose fields are exactly the keys of conf/task/<name>.yaml (validated before any data loads)
    config_class: ClassVar[type] = object
    #: the splits it provides, of SPLITS: without "train" it is evaluation-only (HumanEval), without "test" it
    #: cannot be a transfer task
    splits: ClassVar[tuple[str, ...]] = SPLITS
    #: what a completion is rewarded for, in one line (docs, the dry run's task line)
    reward: ClassVar[str] = ""
    #: whether a finished run may be scored on it zero-shot (reevaluate.transfer, python -m inner_loop.evaluate)
    transfer: ClassVar[bool] = True

    @property
    def trainable(self) -> bool:
        """Whether a run may train on it: it provides a training split."""
        return "train" in self.splits

    def staged_dataset(self) -> str | None:
        """The hub dataset it loads by name, which staging pins and fetches before members start (None: nothing:
        generated data, local files, or a package's own data)."""
        return None

    @abc.abstractmethod
    def load(self, split: str) -> list[Problem]:
        """Problems of ``split`` (one of SPLITS); validation is carved from the training data, disjoint from it."""

    @abc.abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """Reward in [0, 1] for one completion."""

    def score_many(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        """Batched scoring; code tasks override this to run programs concurrently."""
        return [self.score(p, c) for p, c in zip(problems, completions, strict=True)]

    def demonstration(self, problem: Problem) -> str | None:
        """A correct completion for supervised format warm-up of tiny models, or None if the task has none."""
        return None

    def solved(self, problem: Problem, completion: str) -> bool:
        """Counted as solved for pass@k: full reward."""
        return self.score(problem, completion) >= 1.0

    def solved_many(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[bool]:
        return [s >= 1.0 for s in self.score_many(problems, completions)]


class SplitOverlapError(ValueError):
    """Validation or test prompts also appear in the training split."""


def check_disjoint(task_name: str, splits: dict[str, Sequence[Problem]]) -> None:
    """Fail loudly if any two splits share a prompt (after whitespace normalisation)."""
    hashed = {name: {prompt_hash(p.prompt) for p in probs} for name, probs in splits.items()}
    names = sorted(hashed)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = hashed[first] & hashed[second]
            if shared:
                raise SplitOverlapError(
                    f"task {task_name!r}: {len(shared)} prompt(s) appear in both the {first!r} and {second!r} "
                    "splits; validation must be disjoint from training (fix the data files or the split sizes)"
                )


class SplitTask(Task):
    """A task that builds all of its splits at once, checks them disjoint, and caches them.

    Building every split together is what lets the disjointness check run on each load, whatever split the
    caller asks for first.
    """

    def __init__(self) -> None:
        self._splits: dict[str, list[Problem]] | None = None

    @abc.abstractmethod
    def _build_splits(self) -> dict[str, list[Problem]]:
        """All available splits; a split missing from the result (no test file) is an error when asked for."""

    def load(self, split: str) -> list[Problem]:
        if split not in SPLITS:
            raise ValueError(f"task {self.name!r}: unknown split {split!r}; use one of {SPLITS}")
        if self._splits is None:
            splits = self._build_splits()
            check_disjoint(self.name, splits)
            self._splits = splits
        if split not in self._splits:
            raise ValueError(
                f"task {self.name!r} has no {split!r} data; configure its source (e.g. task.test_file) to use it"
            )
        return list(self._splits[split])


class HubSplitTask(SplitTask):
    """A split task that reads a hub dataset (``config.hub_id``) unless local files are given (``config.train_file``):
    only the hub dataset is staged, local files name none."""

    config: Any

    def staged_dataset(self) -> str | None:
        return self.config.hub_id if self.config.train_file is None else None
