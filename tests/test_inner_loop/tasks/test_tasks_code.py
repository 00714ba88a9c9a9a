"""Code tasks: extracting code from completions, composing HumanEval programs, and sandbox-scored rewards."""
from __future__ import annotations

from pathlib import Path

import pytest

from inner_loop.tasks import build_task
from inner_loop.tasks.common.code_extract import extract_code
from inner_loop.tasks.humaneval import humaneval_program

FIXTURES = Path(__file__).parents[2] / "fixtures"
MBPP = {"name": "mbpp", "train_file": str(FIXTURES / "mbpp_train.jsonl"),
        "test_file": str(FIXTURES / "mbpp_test.jsonl"), "validation_size": 1, "timeout_s": 1.0}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # raw code
        ("Here you go:\n```python\ndef f():\n    return 1\n```\nIt returns 1.", "def f():\n    return 1\n"),
        ("```\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),  # unlabelled fence
        ("```python\ndef f():\n    return 1", "def f():\n    return 1\n"),  # unterminated (length cut)
        ("def f():\n    return 1\n```\n\nExplanation: trivial", "def f():\n    return 1\n"),  # prompt opened it
        ("```bash\npip install x\n```\n```python\nx = 2\n```", "x = 2\n"),  # first PYTHON block
        ("    return a + b\n```", "    return a + b\n"),  # a function body keeps its indentation
    ],
)
def test_extract_code(completion: str, expected: str) -> None:
    assert extract_code(completion) == expected


PROMPT = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n'


def test_humaneval_program_from_body_and_from_full_def() -> None:
    body = humaneval_program(PROMPT, "    return sum(xs)\n\nprint(total([1]))\n", "total")
    assert body == PROMPT + "    return sum(xs)\n\n"  # trailing top-level driver code is cut
    full = humaneval_program(PROMPT, "```python\ndef total(xs):\n    return sum(xs)\n```", "total")
    assert full == PROMPT + "\ndef total(xs):\n    return sum(xs)\n"  # prompt imports stay in force
    compile(body, "body", "exec")
    compile(full, "full", "exec")


def test_humaneval_is_evaluation_only() -> None:
    task = build_task({"name": "humaneval", "test_size": 3})
    assert task.trainable is False
    for split in ("train", "validation"):
        with pytest.raises(ValueError, match="evaluation-only"):
            task.load(split)
    problems = task.load("test")
    assert [p.id for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert problems[0].tests[0].rstrip().endswith(f"check({problems[0].entry_point})")
    with pytest.raises(ValueError, match="task.test_size=500"):
        build_task({"name": "humaneval", "test_size": 500}).load("test")


# ---- through the real sandbox ----

def test_mbpp_rewards_fraction_of_asserts_passed() -> None:
    task = build_task(MBPP)
    problems = {p.id: p for p in task.load("train") + task.load("validation") + task.load("test")}
    add, root = problems["mbpp-601"], problems["mbpp-606"]
    completions = [
        task.demonstration(add),  # correct, fenced
        "def add(a, b):\n    return abs(a) + b\n",  # fails only add(-1, 1) == 0: 2 of 3
        "def add(a, b):\n    return a * b\n",  # add(1,2)=2 x, add(-1,1)=-1 x, add(10,5)=50 x
        "def add(a, b):\n    while True: pass\n",  # times out
        "Sorry, I cannot help with that.",  # not code at all
        task.demonstration(root),  # needs the setup code's `import math`
    ]
    rewards = task.score_many([add] * 5 + [root], completions)
    assert rewards == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 0.0, 1.0])
    assert task.score(add, "def add(a, b):\n    return a - b\n") == 0.0
    assert task.solved_many([add, add], ["def add(a, b):\n    return abs(a) + b\n", task.demonstration(add)]) == [
        False, True]


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    task = build_task({"name": "humaneval", "test_size": 4, "timeout_s": 10.0})
    problems = task.load("test")
    bodies = [p.meta["solution"] for p in problems]
    assert task.score_many(problems, bodies) == [1.0] * 4
    wrong = ["    return None\n"] * 4
    assert task.score_many(problems, wrong) == [0.0] * 4
    # a chat-style completion repeating the whole function in a fenced block
    first = problems[0]
    signature = first.meta["code_prompt"].split('"""')[0].strip()  # imports + "def ...:" without the docstring
    full_def = f"Sure:\n```python\n{signature}\n{bodies[0]}```"
    assert "def has_close_elements" in full_def
    assert task.score(first, full_def) == 1.0


def test_every_mbpp_fixture_solution_passes_and_wrong_ones_score_zero() -> None:
    """The asserts run in the trusted grader now: every reference solution of the fixtures (full and
    sanitized format) still passes all its asserts, and a `return None` body still gets 0."""
    full = build_task(MBPP)
    sanitized = build_task({"name": "mbpp", "train_file": str(FIXTURES / "mbpp_sanitized.json"),
                            "validation_size": 1, "timeout_s": 5.0})
    for task, splits in ((full, ("train", "validation", "test")), (sanitized, ("train", "validation"))):
        problems = [p for split in splits for p in task.load(split)]
        assert len(problems) >= 3
        assert task.score_many(problems, [task.demonstration(p) for p in problems]) == [1.0] * len(problems)
        wrong = [p.meta["solution"].split(":", 1)[0] + ":\n    return None\n" for p in problems]
        assert task.score_many(problems, wrong) == [0.0] * len(problems)
