"""GSM8K grade-school math: hub ``openai/gsm8k`` (config ``main``) or local files with the same fields.

Rows have ``question`` and ``answer``; the gold answer is the text after the last ``####`` of ``answer``.
Reward: 1 if the LAST number in the completion equals the gold number, else 0. Numbers are compared as exact
values, so commas, "$", a trailing period, negatives, decimals and simple fractions are understood and
"5.0" equals "5" (see inner_loop/tasks/common/numbers.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inner_loop.tasks.base import HubSplitTask, Problem
from inner_loop.tasks.common.data_files import load_hub_rows, read_local_rows, require_fields
from inner_loop.tasks.common.numbers import last_number, parse_number
from inner_loop.tasks.common.splits import carve_splits
from inner_loop.tasks.task_config import fill_prompt_template, require_split_data

GOLD_MARKER = "####"


@dataclass
class GSM8KConfig:
    """The schema of task=gsm8k: conf/task/gsm8k.yaml composes on it (task/gsm8k_schema, with its
    name), so each field is the one home of its key's type, default and meaning."""

    #: hub dataset id and config, loaded with datasets.load_dataset (needs network or a warm HF cache)
    hub_id: str = "openai/gsm8k"
    hub_config: str | None = "main"
    #: local files in the hub's format (.json array or JSON lines, .jsonl, .parquet); when train_file is set the hub is
    #: not used. test_file is optional (without it the test split is unavailable).
    train_file: str | None = None
    test_file: str | None = None
    #: training problems after carving validation (null = all that remain)
    train_size: int | None = None
    #: validation problems carved from the training split
    validation_size: int = 500
    #: test problems, the first N of the test split (null = all)
    test_size: int | None = None
    #: seed of the shuffle that picks the validation subset
    split_seed: int = 0
    #: prompt format; field {question}
    prompt_template: str = "Question: {question}\nAnswer:"


def gold_answer(answer_field: str) -> str:
    """The text after the last ``####`` of a GSM8K ``answer`` field, or raise ValueError if there is none."""
    if GOLD_MARKER not in answer_field:
        raise ValueError(f"no {GOLD_MARKER!r} marker in answer {answer_field[-80:]!r}")
    return answer_field.rsplit(GOLD_MARKER, 1)[1].strip()


def answer_matches(completion: str, gold: str) -> bool:
    """True when the last number of ``completion`` equals the number ``gold`` (exact, after normalisation)."""
    expected = parse_number(gold)
    found = last_number(completion)
    return expected is not None and found is not None and found == expected


class GSM8KTask(HubSplitTask):
    name = "gsm8k"
    config_class = GSM8KConfig
    reward = "1 when the completion's final number equals the gold answer, else 0"

    def __init__(self, config: GSM8KConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        require_split_data(self.name, c)
        fill_prompt_template(c.prompt_template, self.name, question="?")

    def _rows(self, split: str) -> tuple[list[dict[str, Any]], str] | None:
        c = self.config
        if c.train_file is None:
            return load_hub_rows(c.hub_id, c.hub_config, split), f"hub dataset {c.hub_id!r} split {split!r}"
        path = c.train_file if split == "train" else c.test_file
        if path is None:
            return None
        return read_local_rows(path), f"data file {path!r}"

    def _problems(self, split: str) -> list[Problem] | None:
        loaded = self._rows(split)
        if loaded is None:
            return None
        rows, where = loaded
        require_fields(rows, {"question": str, "answer": str}, where)
        problems = []
        for number, row in enumerate(rows, start=1):
            try:
                gold = gold_answer(row["answer"])
            except ValueError as exc:
                raise ValueError(f"{where}, row {number}: {exc}") from exc
            if parse_number(gold) is None:
                raise ValueError(f"{where}, row {number}: gold answer {gold!r} after {GOLD_MARKER!r} is not a number")
            prompt = fill_prompt_template(self.config.prompt_template, self.name, question=row["question"])
            problems.append(Problem(id=f"gsm8k-{split}-{number - 1}", prompt=prompt, answer=gold,
                                    meta={"solution": row["answer"]}))
        return problems

    def _build_splits(self) -> dict[str, list[Problem]]:
        c = self.config
        return carve_splits(self.name, self._problems("train") or [], self._problems("test"),
                            validation_size=c.validation_size, train_size=c.train_size, test_size=c.test_size,
                            seed=c.split_seed)

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if answer_matches(completion, problem.answer) else 0.0

    def demonstration(self, problem: Problem) -> str:
        """The dataset's worked solution, with its final ``#### answer`` line."""
        return " " + problem.meta.get("solution", f"{GOLD_MARKER} {problem.answer}")

