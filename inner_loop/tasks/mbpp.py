"""MBPP (Mostly Basic Python Problems): hub ``google-research-datasets/mbpp`` or local files in its format.

Both hub configs are read: ``full`` rows have ``text``, ``code``, ``test_list``, ``test_setup_code``,
``challenge_test_list``; ``sanitized`` rows have ``prompt``, ``code``, ``test_list``, ``test_imports``. The
prompt shows the task text and the first test (the usual MBPP prompt, which also fixes the function name).

Reward: the fraction of the task's asserts that pass when the completion's code runs in the sandbox
(inner_loop.sandbox.pool, ``task.timeout_s`` per program) and the asserts are evaluated by the trusted grader
(inner_loop.sandbox.grading); solved = every assert passes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from inner_loop.sandbox.grading import Job
from inner_loop.tasks.base import HubSplitTask, Problem, check_disjoint, prompt_hash
from inner_loop.tasks.common.code_extract import extract_code
from inner_loop.tasks.common.data_files import load_hub_rows, read_local_rows, require_fields
from inner_loop.tasks.common.splits import carve_splits, dedupe, log_splits
from inner_loop.tasks.task_config import (fill_prompt_template, require_existing_file, require_split_data,
                                          sandbox_config)

if TYPE_CHECKING:
    from inner_loop.sandbox.pool import SandboxConfig

logger = logging.getLogger(__name__)

#: task.validation_source: auto = the source's own validation split when it has one (the hub always; local files
#: when task.validation_file is set), else carve; hub = require that split; carve = carve from the training pool.
VALIDATION_SOURCES = ("auto", "hub", "carve")


@dataclass
class MBPPConfig:
    """The schema of task=mbpp: conf/task/mbpp.yaml composes on it (task/mbpp_schema, with its
    name), so each field is the one home of its key's type, default and meaning."""

    #: hub dataset id and config (full | sanitized), loaded with datasets.load_dataset
    hub_id: str = "google-research-datasets/mbpp"
    hub_config: str | None = "full"
    #: hub splits merged into the training pool (validation is carved from it); never "test"
    train_splits: list[str] = field(default_factory=lambda: ["train"])
    #: local files in the hub's format (.json / .jsonl / .parquet); when train_file is set the hub is not used
    train_file: str | None = None
    test_file: str | None = None
    #: local file in the hub's format holding the validation split (with train_file; used unless
    #: validation_source=carve)
    validation_file: str | None = None
    #: where validation comes from: auto = the source's validation split when it has one (the hub always; local files
    #: when validation_file is set), else carved; hub = require that split; carve = always carve validation_size
    validation_source: str = "auto"
    #: training problems after carving validation (null = all that remain)
    train_size: int | None = None
    #: validation problems carved from the training pool (only when validation is carved, see validation_source)
    validation_size: int = 50
    #: test problems, the first N of the test split (null = all)
    test_size: int | None = None
    #: seed of the shuffle that picks the validation subset
    split_seed: int = 0
    #: also score challenge_test_list asserts (config "full" only)
    include_challenge_tests: bool = False
    #: prompt format; fields {text}, {first_test}, {tests} (all of test_list, one per line)
    prompt_template: str = "{text}\nYour code should pass this test:\n{first_test}\n"
    #: wall-clock limit in seconds for running one completion's program with its tests in the sandbox. A step scores its
    #: whole batch before it trains, so one completion that loops holds the step this long (measured: the stall equals
    #: the limit, whatever the worker count). 1.5 s is 10x the slowest of the 164 HumanEval canonical solutions graded
    #: here (0.128-0.135 s on a 2-core Xeon; median 0.012 s): room for a 3x slower machine and 3x slower honest code,
    #: where 5 s added ~5 s (80% of an mbpp_qwen3 step on an H200) per looping completion
    #: (bench/bench_sandbox_timeout.py)
    timeout_s: float = 1.5  # conf/task/mbpp.yaml says why (bench/bench_sandbox_timeout.py)
    #: the sandbox that runs completions (inner_loop.sandbox.pool.SandboxConfig): require_isolation (refuse to run
    #: without bubblewrap; set true on a cluster), memory_mb (1024), max_processes (32), max_file_mb (64), tmp_mb (64),
    #: scratch_mb (256), workers (0: two per CPU of the job's allocation), python (interpreter inside; "": this one).
    #: {}: those defaults. On the command line add a key with a plus: `python -m inner_loop.run task=mbpp
    #: +task.sandbox.require_isolation=true`
    sandbox: dict[str, Any] = field(default_factory=dict)


def score_programs(items: Sequence[Job | tuple[str, list[str]]], timeout_s: float,
                   sandbox_settings: "SandboxConfig | None" = None) -> list[float]:
    """Fraction of asserts passed per job: programs run concurrently in the sandbox (with the task's
    ``task.sandbox`` settings), the asserts in the trusted grader (inner_loop.sandbox.grading), so a program cannot forge
    its own score."""
    from inner_loop.sandbox import pool as sandbox

    outcomes = sandbox.run_many(list(items), timeout_s=timeout_s, config=sandbox_settings)
    return [outcome.passed / outcome.total if outcome.total else 0.0 for outcome in outcomes]


class MBPPTask(HubSplitTask):
    name = "mbpp"
    config_class = MBPPConfig
    reward = "1 when the completed program passes the problem's tests (sandboxed), else 0"

    def __init__(self, config: MBPPConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        require_split_data(self.name, c)
        if not c.train_splits:
            raise ValueError("task 'mbpp': task.train_splits must name at least one hub split (e.g. [train])")
        if "test" in c.train_splits:
            raise ValueError("task 'mbpp': task.train_splits must not contain 'test'; the test split is held out")
        if not c.timeout_s > 0:
            raise ValueError(f"task 'mbpp': task.timeout_s must be > 0, got {c.timeout_s}")
        self._check_validation_source()
        self.sandbox = sandbox_config(self.name, c.sandbox)
        fill_prompt_template(c.prompt_template, self.name, text="?", first_test="?", tests="?")

    def _check_validation_source(self) -> None:
        c = self.config
        if c.validation_source not in VALIDATION_SOURCES:
            raise ValueError(f"task 'mbpp': task.validation_source must be one of {list(VALIDATION_SOURCES)}, "
                             f"got {c.validation_source!r}")
        require_existing_file(self.name, "validation_file", c.validation_file)
        if c.validation_file is not None and c.train_file is None:
            raise ValueError("task 'mbpp': task.validation_file is set but task.train_file is not; local files "
                             "replace the hub as a set (set train_file too, or drop validation_file)")
        if c.validation_file is not None and c.validation_source == "carve":
            raise ValueError("task 'mbpp': task.validation_file is set but task.validation_source=carve ignores it; "
                             "set task.validation_source=auto (or hub), or drop validation_file")
        if c.validation_source == "hub" and c.train_file is not None and c.validation_file is None:
            raise ValueError("task 'mbpp': task.validation_source=hub with local files needs task.validation_file "
                             "(the hub's validation split in the same format), or set task.validation_source=carve")
        if self._uses_source_validation() and "validation" in c.train_splits and c.train_file is None:
            raise ValueError("task 'mbpp': task.train_splits contains 'validation' but the validation split is "
                             "scored; drop it from train_splits or set task.validation_source=carve")

    def _uses_source_validation(self) -> bool:
        """Whether validation is the source's own split (hub or validation_file) rather than carved."""
        c = self.config
        if c.validation_source == "carve":
            return False
        return c.train_file is None or c.validation_file is not None

    def _sources(self, split: str) -> list[tuple[list[dict[str, Any]], str]]:
        c = self.config
        if c.train_file is None:
            names = c.train_splits if split == "train" else [split]
            return [(load_hub_rows(c.hub_id, c.hub_config, name, ("train_file", "test_file", "validation_file")),
                     f"hub dataset {c.hub_id!r} split {name!r}") for name in names]
        path = {"train": c.train_file, "test": c.test_file, "validation": c.validation_file}[split]
        return [] if path is None else [(read_local_rows(path), f"data file {path!r}")]

    def _problems(self, split: str) -> list[Problem] | None:
        sources = self._sources(split)
        if not sources:
            return None
        problems = []
        for rows, where in sources:
            require_fields(rows, {"code": str, "test_list": list}, where)
            for number, row in enumerate(rows, start=1):
                problems.append(self._problem(row, f"{where}, row {number}", f"mbpp-{split}-{len(problems)}"))
        return problems

    def _problem(self, row: dict[str, Any], where: str, fallback_id: str) -> Problem:
        text = row.get("text", row.get("prompt"))
        if not isinstance(text, str):
            raise ValueError(f"{where}: needs a string field 'text' (config full) or 'prompt' (config sanitized)")
        tests = list(row["test_list"])
        if self.config.include_challenge_tests:
            tests += list(row.get("challenge_test_list") or [])
        if not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert statements")
        setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
        prompt = fill_prompt_template(self.config.prompt_template, self.name, text=text.strip(), first_test=tests[0],
                               tests="\n".join(row["test_list"]))
        task_id = row.get("task_id")
        return Problem(id=f"mbpp-{task_id}" if task_id is not None else fallback_id, prompt=prompt,
                       tests=tuple(tests), meta={"setup": setup, "solution": row["code"]})

    def _build_splits(self) -> dict[str, list[Problem]]:
        c = self.config
        pool = self._problems("train") or []
        if not self._uses_source_validation():
            return carve_splits(self.name, pool, self._problems("test"), validation_size=c.validation_size,
                                train_size=c.train_size, test_size=c.test_size, seed=c.split_seed)
        # The source's own validation split (hub full: 90 problems, so pass@1 moves in steps of 1/90); training
        # prompts that repeat a validation prompt are dropped so the fitness is measured on unseen problems.
        validation = dedupe(self.name, "validation", self._problems("validation") or [])
        if not validation:
            raise ValueError("task 'mbpp': the validation split is empty; fix the data or set "
                             "task.validation_source=carve")
        seen = {prompt_hash(p.prompt) for p in validation}
        clean = [p for p in pool if prompt_hash(p.prompt) not in seen]
        if len(clean) < len(pool):
            logger.warning("task mbpp: dropped %d training prompt(s) that also appear in the validation split",
                           len(pool) - len(clean))
        splits = carve_splits(self.name, clean, self._problems("test"), validation_size=0,
                              train_size=c.train_size, test_size=c.test_size, seed=c.split_seed, log=False)
        splits["validation"] = validation
        check_disjoint(self.name, splits)
        log_splits(self.name, splits, " (validation: the source's own validation split)")
        return splits

    def program(self, problem: Problem, completion: str) -> str:
        """What the sandbox runs: the task's setup code (imports), then the completion's code."""
        setup = problem.meta.get("setup", "")
        code = extract_code(completion)
        return f"{setup}\n{code}" if setup else code

    def score(self, problem: Problem, completion: str) -> float:
        return self.score_many([problem], [completion])[0]

    def score_many(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        # the setup code (the dataset's imports) runs in the program AND, trusted, in the grader beside the tests
        items = [Job(self.program(p, c), tuple(p.tests), setup=p.meta.get("setup", ""))
                 for p, c in zip(problems, completions, strict=True)]
        return score_programs(items, self.config.timeout_s, self.sandbox)

    def demonstration(self, problem: Problem) -> str:
        """The reference solution as a fenced Python block."""
        return f"```python\n{problem.meta['solution'].strip()}\n```"
