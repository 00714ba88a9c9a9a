"""GSM-Symbolic: GSM8K-style word problems generated offline by reasoning-gym's ``gsm_symbolic`` dataset.

reasoning-gym seeds item ``i`` of a dataset with ``seed + i``, so datasets with nearby seeds share items. The
training pool is therefore one dataset (seed ``task.seed``) from which validation is carved with a seeded
shuffle, and the test set is a second dataset whose seeds start after the pool's last one; pool items that
still coincide with a test question are dropped and the splits are checked disjoint by prompt hash.

Reward: the GSM8K rule (the LAST number in the completion equals the answer). reasoning-gym's own scorer reads
the first number and gives 0.01 for a wrong one; a 0/1 reward keeps training reward and pass@1 consistent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inner_loop.tasks.base import Problem, SplitTask
from inner_loop.tasks.gsm8k import answer_matches
from inner_loop.tasks.common.splits import carve_splits
from inner_loop.tasks.task_config import fill_prompt_template, require_non_negative

DATASET_NAME = "gsm_symbolic"
# Extra items drawn for the pool so that the rare duplicate questions do not make task.train_size unreachable.
_POOL_MARGIN = 0.1


@dataclass
class GSMSymbolicConfig:
    """The schema of task=gsm_symbolic: conf/task/gsm_symbolic.yaml composes on it (task/gsm_symbolic_schema, with its
    name), so each field is the one home of its key's type, default and meaning."""

    #: training problems
    train_size: int = 2000
    #: validation problems carved from the generated training pool
    validation_size: int = 200
    #: test problems (reporting only, never fitness)
    test_size: int = 200
    #: reasoning-gym generation seed (>= 0)
    seed: int = 0
    #: seed of the shuffle that picks the validation subset from the pool
    split_seed: int = 0
    #: prompt format; field {question}
    prompt_template: str = "Question: {question}\nAnswer:"


def _generate(seed: int, size: int) -> list[dict[str, Any]]:
    import reasoning_gym

    if size == 0:
        return []
    dataset = reasoning_gym.create_dataset(DATASET_NAME, seed=seed, size=size)
    return [dataset[i] for i in range(size)]


class GSMSymbolicTask(SplitTask):
    name = "gsm_symbolic"
    config_class = GSMSymbolicConfig
    reward = "1 when the completion's final number equals the gold answer, else 0"

    def __init__(self, config: GSMSymbolicConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        require_non_negative(self.name, train_size=c.train_size, validation_size=c.validation_size,
                             test_size=c.test_size)
        if c.seed < 0:
            raise ValueError(f"task 'gsm_symbolic': task.seed must be >= 0, got {c.seed}")
        fill_prompt_template(c.prompt_template, self.name, question="?")

    def _problems(self, split: str, items: list[dict[str, Any]]) -> list[Problem]:
        return [
            Problem(
                id=f"gsm_symbolic-{split}-{i}",
                prompt=fill_prompt_template(self.config.prompt_template, self.name, question=item["question"]),
                answer=str(item["answer"]),
                meta={"solution": item["metadata"].get("answer_cot", "")},
            )
            for i, item in enumerate(items)
        ]

    def _build_splits(self) -> dict[str, list[Problem]]:
        c = self.config
        pool_size = int((c.train_size + c.validation_size) * (1 + _POOL_MARGIN)) + 10
        pool = self._problems("train", _generate(c.seed, pool_size))
        test = self._problems("test", _generate(c.seed + pool_size, c.test_size))
        return carve_splits(self.name, pool, test, validation_size=c.validation_size, train_size=c.train_size,
                            test_size=c.test_size, seed=c.split_seed)

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if answer_matches(completion, problem.answer) else 0.0

    def demonstration(self, problem: Problem) -> str:
        """reasoning-gym's step-by-step solution, which ends in ``#### answer``."""
        return " " + (problem.meta.get("solution") or f"#### {problem.answer}")
