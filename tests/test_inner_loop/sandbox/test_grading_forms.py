"""The trusted grader: the plain-data codec (exact types, bounds) and the test forms it grades honestly."""

from __future__ import annotations


import json
import random
import re

import pytest

from inner_loop.sandbox.grading import CandidateGone, Job, Session, run_tests
from inner_loop.sandbox.codec import MAX_DEPTH, MAX_MESSAGE_BYTES, Unsendable, decode, encode
from inner_loop.sandbox.pool import SandboxConfig, SandboxPool

# ---- codec: exact builtin types only, bounded ----

PLAIN = [None, True, 0, -7, 2**80, 1.5, float("inf"), -0.0, 1j + 2, "x\n", b"\x00\xff", [1, [2]], (1, (2, "a")),
         {1: "a", (2, 3): [4]}, {1, (2, 3)}, frozenset({"a"}), (), [], {}]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_values_round_trip_with_their_exact_types(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    assert json.loads(encode(value)) is not None or value is None


def test_nan_round_trips():
    back = decode(encode(float("nan")))
    assert type(back) is float and back != back


class _Int(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _Str(str):
    pass


def _stable_id(value: object) -> str:
    """repr without memory addresses: parallel workers must collect the same test names."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize("value", [_Int(3), _Str("a"), [1, _Int(2)], {_Str("k"): 1}, {1: _Int(1)}, (object(),),
                                   print, range(3), bytearray(b"a"), {1: 2}.keys()], ids=_stable_id)
def test_subclasses_and_other_types_cannot_be_sent(value):
    with pytest.raises(Unsendable):
        encode(value)


def test_depth_and_size_are_bounded_on_both_sides():
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(Unsendable, match="deeper"):
        encode(deep)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(Unsendable):
        encode(cyclic)
    # a forged answer is checked where it is decoded: too deep, too big, off-format
    with pytest.raises(Unsendable):
        decode("[" * 100_000 + "]" * 100_000)
    with pytest.raises(Unsendable, match="larger"):
        decode('"' + "a" * MAX_MESSAGE_BYTES + '"')
    for forged in ('{"set":[[1]]}', '{"evil":1}', '{"tuple":1}', '{"complex":[1,2]}', '{"dict":[[1]]}', "nope"):
        with pytest.raises(Unsendable):
            decode(forged)


# ---- the grader's side without a sandbox: a scripted channel ----

def _scripted(answers: dict) -> Session:
    """A session whose program is a table: name -> value (or a callable computing it from args)."""
    def ask(message):
        target = answers[message["name"]]
        if message["op"] == "get":
            return {"callable": True} if callable(target) else {"ok": json.loads(encode(target))}
        args = decode(json.dumps(message["args"]))
        return {"ok": json.loads(encode(target(*args)))}
    return Session(ask=ask)


def test_program_names_resolve_through_the_channel_and_builtins_never_do():
    session = _scripted({"f": lambda x: x * 2, "v": [1, 2], "abs": lambda x: 0})
    tests = ("assert f(2) == 4", "assert v == [1, 2]", "assert abs(f(-1)) == 2", "assert f(1) == 3")
    assert run_tests(Job("", tests), session) == [True, True, True, False]
    assert session.calls == 4  # abs stayed the grader's own builtin


def test_the_trainers_random_state_is_not_touched_by_tests():
    state = random.getstate()
    session = _scripted({"f": lambda x: x})
    test = "import random\nfor _ in range(20):\n    x = random.randint(0, 9)\n    assert f(x) == x\n"
    assert run_tests(Job("", (test,)), session) == [True]
    assert random.getstate() == state


def test_a_gone_program_fails_every_remaining_test_even_under_bare_except():
    session = Session(ask=lambda message: None)
    tests = ("try:\n    f(1)\nexcept Exception:\n    pass\n", "assert True")
    assert run_tests(Job("", tests), session) == [False, False]
    with pytest.raises(CandidateGone):
        session.get("f")


# ---- through the real sandbox: the test forms of MBPP and HumanEval ----

CHECK_LOOP = """
import math
def check(candidate):
    for x in range(1, 30):
        assert abs(candidate(x) - math.sqrt(x)) < 1e-6
    assert math.isclose(candidate(2.0), 1.41421356, rel_tol=1e-6)
    assert {candidate(4), candidate(9)} == {2.0, 3.0}
check(root)
"""

FORMS = {  # name: (correct program, wrong program, tests, setup, entry points)
    "assert_eq": ("def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n",
                  ["assert add(1, 2) == 3", "assert add(10, 5) == 15"], "", ()),
    "check_loop_tolerance": ("import math\ndef root(x):\n    return math.sqrt(x)\n", "def root(x):\n    return x / 2\n",
                             [CHECK_LOOP], "", ("root",)),
    "set_and_sorted": ("def uniq(xs):\n    return list(set(xs))\n", "def uniq(xs):\n    return xs + [0]\n",
                       ["assert set(uniq([1, 1, 2])) == {1, 2}", "assert sorted(uniq([3, 3])) == [3]"], "", ()),
    "tuple_vs_list": ("def pair(a):\n    return (a, a)\n", "def pair(a):\n    return [a, a]\n",
                      ["assert pair(1) == (1, 1)"], "", ()),
    "int_vs_float_kwargs": ("def scale(x, k=1):\n    return x * k\n", "def scale(x, k=1):\n    return str(x * k)\n",
                            ["assert scale(2, k=3) == 6 and isinstance(scale(2, k=3), int)"], "", ()),
    "expects_exception": ("def parse(s):\n    return int(s)\n", "def parse(s):\n    return 0\n",
                          ["try:\n    parse('x')\nexcept ValueError:\n    pass\n"
                           "else:\n    raise AssertionError('no error')"],
                          "", ()),
    # HumanEval style: the prompt (trusted setup) defines a helper and a stub of the entry point
    "prompt_helper": ("def poly(xs, x):\n    return 999\ndef zero(xs):\n    return -xs[0] / xs[1]\n",
                      "def poly(xs, x):\n    return 0\ndef zero(xs):\n    return 12345.0\n",
                      ["def check(candidate):\n    assert abs(poly([2, 4], candidate([2, 4]))) < 1e-9\ncheck(zero)\n"],
                      "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n"
                      "def zero(xs):\n    '''stub'''\n", ("zero",)),
    "module_value": ("TABLE = {'a': 1}\n", "TABLE = {'a': 2}\n", ["assert TABLE['a'] == 1"], "", ()),
    # MBPP style: the test names `math` and relies on the program's `import math` (no setup code); the grader
    # uses its own math, so the wrong program cannot help itself by shipping a forgiving `math` either
    "stdlib_from_the_program": ("import math\ndef area(r):\n    return math.pi * r * r\n",
                                "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef area(r):\n"
                                "    return 3\n",
                                ["assert math.isclose(area(2), 12.566370614359172, rel_tol=1e-9)"], "", ()),
}


@pytest.fixture(scope="module")
def pool():
    created = SandboxPool(SandboxConfig(workers=2))
    yield created
    created.close()


@pytest.mark.parametrize("name", list(FORMS))
def test_each_form_passes_the_right_program_and_fails_the_wrong_one(pool, name):
    right, wrong, tests, setup, entry = FORMS[name]
    jobs = [Job(program, tuple(tests), setup=setup, entry_points=entry) for program in (right, wrong)]
    good, bad = pool.run_many(jobs, timeout_s=10.0)
    assert good.status == "passed" and good.passed == len(tests), good
    assert bad.passed == 0 and bad.status == "failed", bad


def test_unsplittable_forms_fail_never_pass(pool):
    """A test that needs an object of the program's own class, or sees in-place mutation of its argument,
    cannot be graded through plain data: it fails (documented), it is never passed by default."""
    program = ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
               "def longest(pairs):\n    return len(pairs)\n"
               "def sort_in_place(xs):\n    xs.sort()\n")
    tests = ["assert longest([Pair(1, 2), Pair(3, 4)]) == 2",
             "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]"]
    outcome = pool.run(program, tests, timeout_s=10.0)
    assert outcome.passed == 0 and outcome.status == "failed", outcome
    assert "not exact plain" in outcome.stderr_tail


def test_stop_iteration_from_the_program_cannot_cut_a_tests_iteration_short(pool):
    """Re-raised in the grader, StopIteration would end ``all(map(f, cases))`` early and pass it."""
    program = "def is_pos(x):\n    raise StopIteration\n"
    tests = ["assert all(map(is_pos, [1, 2, 3]))", "assert list(map(is_pos, [1])) == [True]"]
    outcome = pool.run(program, tests, timeout_s=10.0)
    assert outcome.passed == 0 and outcome.status == "failed", outcome


FORGE_ANSWERS = """
import gc, os
def forge(lines):
    for obj in gc.get_objects():
        if getattr(obj, "__name__", "") == "report" and getattr(obj, "__closure__", None):
            for line in lines:
                obj(line)
def add(a, b):
    forge(LINES)
    return a - b
"""


@pytest.mark.parametrize("lines", [
    ['{"ok":' + "[" * 5000 + "]" * 5000 + "}"],  # deeper than the decoder allows
    ['{"ok":{"set":[[1]]}}', '{"ok":{"dict":[[[1],2]]}}', '{"ok":{"evil":3}}'],  # not real values
    ['{"ok":"' + "x" * (MAX_MESSAGE_BYTES + 10) + '"}'],  # larger than an answer may be
    ['{"callable":true}', '{"exit":false}', "not json", '{"ok":3,"also":4}'],  # off-protocol
], ids=["deep", "off-format", "huge", "off-protocol"])
def test_forged_channel_answers_are_at_most_values_and_never_break_the_grader(pool, lines):
    """The program can find the harness's nonce-tagged reporter and write any answer line it likes: the
    grader decodes each with the same bounds, so the worst it gets is a failed test."""
    program = f"LINES = {lines!r}\n" + FORGE_ANSWERS
    outcome = pool.run(program, ["assert add(1, 2) == 3", "assert add(5, 5) == 10"], timeout_s=10.0)
    assert outcome.passed == 0 and outcome.status in ("failed", "crashed"), outcome
    assert pool.run("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"], timeout_s=10.0).solved
