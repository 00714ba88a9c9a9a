"""task.sandbox: a code task's sandbox settings come from its config, are checked when the task is built, and
are the ones its programs actually run under."""
from __future__ import annotations

from pathlib import Path

import pytest

from inner_loop.sandbox import pool as sandbox
from inner_loop.tasks import build_task
from inner_loop.tasks.base import Problem

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

MBPP_LOCAL = {"name": "mbpp", "train_file": str(FIXTURES / "mbpp_train.jsonl"), "validation_size": 1}
# Allocates ~300 MB before defining the function the asserts call.
GREEDY = "```python\nblock = bytearray(300 * 2**20)\ndef add(a, b):\n    return a + b\n```"


def _add_problem(task) -> Problem:
    return next(p for p in task.load("train") + task.load("validation") if "add two numbers" in p.prompt)


def test_the_memory_limit_of_task_sandbox_is_the_one_programs_run_under():
    roomy = build_task(MBPP_LOCAL)
    tight = build_task({**MBPP_LOCAL, "sandbox": {"memory_mb": 128}})
    assert tight.sandbox.memory_mb == 128 and roomy.sandbox == sandbox.SandboxConfig()
    problem = _add_problem(roomy)
    assert roomy.score_many([problem], [GREEDY]) == [1.0]
    assert tight.score_many([problem], [GREEDY]) == [0.0]


@pytest.mark.parametrize("name", ["mbpp", "humaneval"])
def test_every_code_task_passes_its_settings_to_the_pool(monkeypatch, name):
    seen = []
    monkeypatch.setattr(sandbox, "run_many", lambda items, timeout_s, config=None: seen.append(config) or [
        sandbox.Outcome(1, 1, "passed", "") for _ in items])
    cfg = MBPP_LOCAL if name == "mbpp" else {"name": "humaneval", "test_size": 1}
    task = build_task({**cfg, "sandbox": {"require_isolation": True, "workers": 3}})
    problem = task.load("validation" if name == "mbpp" else "test")[0]
    task.score_many([problem], ["pass"])
    assert seen == [sandbox.SandboxConfig(require_isolation=True, workers=3)]


@pytest.mark.parametrize("settings, message", [
    ({"memroy_mb": 512}, r"task\.sandbox\.memroy_mb"),
    ({"memory_mb": 0}, r"task\.sandbox\.memory_mb must be a positive integer"),
    ({"require_isolation": "yes"}, r"task\.sandbox\.require_isolation must be true or false"),
    ({"python": "python3"}, r"task\.sandbox\.python must be an absolute path"),
])
def test_bad_sandbox_settings_are_refused_when_the_task_is_built(settings, message):
    with pytest.raises(ValueError, match=message):
        build_task({**MBPP_LOCAL, "sandbox": settings})
