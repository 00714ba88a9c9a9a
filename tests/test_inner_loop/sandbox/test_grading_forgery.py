"""Programs that forge their own score: each one beats a naive same-process grader and scores 0 with ours.

The control is a naive grader that runs the program and then each test in ONE interpreter and reports each
test's result on a channel the program can reach (stderr lines, last report per test wins). It runs as a
program inside the sandbox, so even the control is contained. Every forgery below must (a) get all tests
"passed" from the control, proving it is a real attack, and (b) get 0 passed tests from the real grader.
Every program here is WRONG: an honest grader must give it 0.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from inner_loop.sandbox.pool import SandboxConfig, SandboxPool

pytestmark = pytest.mark.slow
TIMEOUT_S = 10.0
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
FLOAT_TESTS = ["assert abs(half(3) - 1.5) < 1e-6", "assert abs(half(1) - 0.5) < 1e-6"]

NAIVE_GRADER = textwrap.dedent('''
    import os


    def report(index, ok):
        os.write(2, ("NAIVE test %d %s\\n" % (index, "ok" if ok else "fail")).encode())


    def naive_grade(program, tests):
        namespace = {"__name__": "__main__"}
        exec(program, namespace)
        for index, test in enumerate(tests):
            try:
                exec(test, namespace)
            except Exception:
                report(index, False)
            else:
                report(index, True)


    naive_grade(PROGRAM, TESTS)
    # what the end of the naive grader's interpreter runs: collection of the program's objects, atexit
    import atexit, gc
    gc.collect()
    atexit._run_exitfuncs()
    ''')

# -- the attacks; `ded` keeps them readable --
ded = textwrap.dedent
WRONG_ADD = "def add(a, b):\n    return a - b\n"
# the argument shapes a reporting function may take: (index, ok), or protocol words in order
REPORT_CALLS = ("CALLS = [(i, True) for i in range(8)] + [('program ok',)] + "
                "[('test %d ok' % i,) for i in range(8)] + [('done',)]")
FORGE_LINES = "b''.join(b'NAIVE test %d ok\\n' % i for i in range(8))"

FORGERIES: dict[str, tuple[str, list[str]]] = {
    # walks its stack frames to the harness's reporting function, reports passes and leaves
    "stack_frame_walk": (ded("""
        import os, sys
        """ + REPORT_CALLS + """
        frame = sys._getframe(0)
        while frame is not None:
            for scope in (frame.f_locals, frame.f_globals):
                report = scope.get("report")
                if callable(report):
                    for args in CALLS:
                        try:
                            report(*args)
                        except Exception:
                            pass
            frame = frame.f_back
        os._exit(0)
        """) + WRONG_ADD, ADD_TESTS),
    # reads the expected value out of the calling test's code object and returns it
    "steal_expected_value": (ded("""
        import sys
        def add(a, b):
            frame = sys._getframe(1)
            while frame is not None:
                found = [c for c in frame.f_code.co_consts if type(c) is int and c not in (a, b)]
                if found:
                    return found[-1]
                frame = frame.f_back
            return -1
        """), ["assert add(1, 2) == 987654321", "assert add(3, 4) == 123456789"]),
    "eq_always_true": (ded("""
        class Anything:
            def __eq__(self, other):
                return True
        def add(a, b):
            return Anything()
        """), ADD_TESTS),
    "int_subclass_lies": (ded("""
        class Liar(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def add(a, b):
            return Liar(a * b + 7)
        """), ADD_TESTS),
    "replace_builtin_abs": (ded("""
        import builtins
        builtins.abs = lambda x: 0
        def half(x):
            return x * 7
        """), FLOAT_TESTS),
    # finds the harness's reporting function among all live objects
    "gc_search": (ded("""
        import gc, os
        """ + REPORT_CALLS + """
        found = [obj for obj in gc.get_objects() if getattr(obj, "__name__", "") == "report" and callable(obj)]
        # every argument shape across every candidate, (index, ok) first: the collector's order of the
        # candidates (which differs run to run) must not decide which one is reached before the process ends
        for args in CALLS:
            for obj in found:
                try:
                    obj(*args)
                except Exception:
                    pass
        os._exit(0)
        """) + WRONG_ADD, ADD_TESTS),
    # a trace hook rewrites the verdict inside the reporting function
    "settrace_hook": (ded("""
        import sys
        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "report":
                local = frame.f_locals  # read once: each read re-syncs it from the frame
                if "ok" in local:
                    local["ok"] = True
                if isinstance(local.get("event"), str):  # a harness that reports "test 0 fail"
                    local["event"] = local["event"].replace("fail", "ok")
            return None
        sys.settrace(tracer)
        """) + WRONG_ADD, ADD_TESTS),
    # a profile hook appends forged pass reports after every write the harness makes
    "setprofile_hook": (ded("""
        import sys, os
        def profiler(frame, event, arg):
            if event == "c_return" and getattr(arg, "__name__", "") == "write":
                sys.setprofile(None)
                os.write(2, """ + FORGE_LINES + """)
                sys.setprofile(profiler)
        sys.setprofile(profiler)
        """) + WRONG_ADD, ADD_TESTS),
    # a wrong predicate whose answers say True to the first test and False to the second, via __bool__
    "bool_trick": (ded("""
        calls = [0]
        class Flip:
            def __bool__(self):
                calls[0] += 1
                return calls[0] == 1
        def is_odd(n):
            return Flip()
        """), ["assert is_odd(3)", "assert not is_odd(4)"]),
    # __hash__ and __eq__ made to fit set membership and set equality
    "hash_trick": (ded("""
        class Twin:
            def __init__(self, h):
                self.h = h
            def __hash__(self):
                return self.h
            def __eq__(self, other):
                return True
        def evens(xs):
            return [Twin(hash(2)), Twin(hash(4))]
        """), ["assert set(evens([1, 2, 3, 4])) == {2, 4}", "assert evens([2, 4])[0] in {2}"]),
    "monkeypatch_math": (ded("""
        import math
        math.isclose = lambda *args, **kwargs: True
        def area(r):
            return 0.0
        """), ["import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)",
               "import math\nassert math.isclose(area(1), 3.1416, rel_tol=1e-3)"]),
    "monkeypatch_operator": (ded("""
        import operator
        operator.eq = lambda a, b: True
        """) + WRONG_ADD, ["import operator\nassert operator.eq(add(1, 2), 3)",
                           "import operator\nassert operator.eq(add(2, 2), 4)"]),
    # writes pass reports to every inherited file descriptor, then exits before any test runs
    "inherited_fds": (ded("""
        import os
        lines = """ + FORGE_LINES + """ + b'{"program":"ok"}\\n{"ok":3}\\n'
        for fd in range(1024):
            try:
                os.write(fd, lines)
            except OSError:
                pass
        os._exit(0)
        """) + WRONG_ADD, ADD_TESTS),
    # reports passes from an atexit hook and from __del__ at shutdown (after the naive harness's failures)
    "atexit_and_del": (ded("""
        import atexit, os
        atexit.register(lambda: os.write(2, """ + FORGE_LINES + """))
        class Late:
            def __del__(self):
                os.write(2, """ + FORGE_LINES + """)
                raise RuntimeError("from __del__")
        keepers = [Late()]
        keepers.append(keepers)  # a cycle: only the collector frees it, after the harness reported
        """) + WRONG_ADD, ADD_TESTS),
    # the returned object's __del__ (run inside the test, before the verdict) swaps the harness's reporting
    # function for one that always says "ok", then raises (exceptions from __del__ are only printed)
    "del_raises_on_result": (ded("""
        import sys
        class Bomb:
            def __eq__(self, other):
                return False
            def __del__(self):
                frame = sys._getframe(1)
                while frame is not None:
                    real = frame.f_globals.get("report")
                    if callable(real) and not getattr(real, "forged", False):
                        forged = lambda index, ok, real=real: real(index, True)
                        forged.forged = True
                        frame.f_globals["report"] = forged
                    frame = frame.f_back
                raise RuntimeError("from __del__")
        def add(a, b):
            return Bomb()
        """), ADD_TESTS),
    # prints pass reports (and fake channel answers) when called, then raises SystemExit past `except Exception`
    "print_fake_messages": (ded("""
        import sys
        def add(a, b):
            for i in range(8):
                print("NAIVE test %d ok" % i, file=sys.stderr, flush=True)
                print('R {"ok":3}', flush=True)
                print('{"program":"ok"}', flush=True)
            raise SystemExit(0)
        """), ADD_TESTS),
    # the function prints pass reports when first called, then ends the process mid-test
    "os_exit_after_partial_output": (ded("""
        import os
        def add(a, b):
            os.write(2, """ + FORGE_LINES + """)
            os.write(1, b'{"ok":3}\\n')
            os._exit(0)
        """), ADD_TESTS),
}


def _naive_passed(stderr_tail: str, total: int) -> int:
    """Tests the naive grader counts as passed: the last report per test wins."""
    last: dict[int, str] = {}
    for index, verdict in re.findall(r"NAIVE test (\d+) (ok|fail)", stderr_tail):
        last[int(index)] = verdict
    return sum(1 for i in range(total) if last.get(i) == "ok")


def _naive_program(program: str, tests: list[str]) -> str:
    return f"PROGRAM = {program!r}\nTESTS = {tests!r}\n" + NAIVE_GRADER


@pytest.fixture(scope="module")
def runs():
    pool = SandboxPool(SandboxConfig(workers=4))
    names = list(FORGERIES)
    ours = pool.run_many([FORGERIES[n] for n in names], timeout_s=TIMEOUT_S)
    naive = pool.run_many([(_naive_program(*FORGERIES[n]), ["assert True"]) for n in names], timeout_s=TIMEOUT_S)
    yield {n: (o, c) for n, o, c in zip(names, ours, naive)}
    pool.close()


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgery_beats_the_naive_grader_and_scores_zero_with_ours(runs, name):
    ours, naive = runs[name]
    total = len(FORGERIES[name][1])
    assert _naive_passed(naive.stderr_tail, total) == total, ("control did not fall for it", naive)
    assert ours.passed == 0 and ours.status != "passed", ours


def test_honest_programs_still_pass_in_both():
    """The same test forms with a correct program: the naive control and our grader both pass them."""
    honest = {
        "add": ("def add(a, b):\n    return a + b\n", ADD_TESTS),
        "half": ("def half(x):\n    return x / 2\n", FLOAT_TESTS),
        "is_odd": ("def is_odd(n):\n    return n % 2 == 1\n", ["assert is_odd(3)", "assert not is_odd(4)"]),
        "evens": ("def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n",
                  ["assert set(evens([1, 2, 3, 4])) == {2, 4}", "assert evens([2, 4])[0] in {2}"]),
        "area": ("import math\ndef area(r):\n    return math.pi * r * r\n",
                 FORGERIES["monkeypatch_math"][1]),
    }
    pool = SandboxPool(SandboxConfig(workers=2))
    try:
        ours = pool.run_many(list(honest.values()), timeout_s=TIMEOUT_S)
        naive = pool.run_many([(_naive_program(p, t), ["assert True"]) for p, t in honest.values()],
                              timeout_s=TIMEOUT_S)
    finally:
        pool.close()
    for name, outcome, control, (_, tests) in zip(honest, ours, naive, honest.values()):
        assert outcome.status == "passed" and outcome.passed == len(tests), (name, outcome)
        assert _naive_passed(control.stderr_tail, len(tests)) == len(tests), (name, control)
