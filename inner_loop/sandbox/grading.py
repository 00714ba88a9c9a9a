"""The trusted half of code grading: test snippets run HERE, outside the interpreter that runs the program.

Why: when tests ran in the program's own interpreter, the program could reach the harness (stack frames,
the garbage collector), swap builtins the tests use, or return objects that lie in ``__eq__``. Here the
dataset's tests run in the trainer process, in a fresh namespace with a copy of the builtins; every use of a
name the program defines is a request over the channel to the sandbox, and the answer is decoded from exact
plain data (``inner_loop.sandbox.codec``). Expected values never enter the sandbox, the comparison and the
pass count never leave this process, and the program's objects never arrive here.

A test that cannot be evaluated this way (it needs an object of the program's own class, or the program
mutating an argument in place) fails: nothing is ever passed by default.
"""
from __future__ import annotations

import builtins
import functools
import importlib
import importlib.util
import json
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from inner_loop.sandbox.codec import Unsendable, from_plain, to_plain
from inner_loop.sandbox.snippet_rewrite import FN, GET, prepare

logger = logging.getLogger(__name__)

MAX_CALLS = 100_000  # channel round trips per program; a test looping on the program stops here


class CandidateError(Exception):
    """The program's answer was an exception of its own, or not plain builtin data."""


class CandidateGone(BaseException):
    """The program's process has ended (exit, crash, time or call limit): no test can use it any more.
    A BaseException so a test's ``except Exception`` cannot swallow it and pass."""


@dataclass(frozen=True)
class Job:
    """One program and its tests. `setup` is trusted dataset code (imports, a HumanEval prompt with its
    helpers) run in the grader before the tests; `entry_points` are read from the program even where the
    setup defines them too (HumanEval's prompt holds a docstring-only stub of the function)."""

    program: str
    tests: tuple[str, ...]
    setup: str = ""
    entry_points: tuple[str, ...] = ()


@dataclass
class Session:
    """The grader's view of one running program: asks go out through `ask`, which returns one parsed
    answer, or None once the run is over (then `end` holds the zygote's end record)."""

    ask: Callable[[dict], dict | None]
    calls: int = 0
    oom: bool = False
    gone: bool = False
    exited_cleanly: bool = False
    end: dict | None = None
    prefetched: dict[str, deque] = field(default_factory=dict)
    _proxies: dict[str, "Remote"] = field(default_factory=dict)

    def keep_answer(self, message: dict, answer: dict) -> None:
        """An answer to a call sent ahead with the program; used when the test makes that call."""
        self.prefetched.setdefault(json.dumps(message), deque()).append(answer)

    def _request(self, message: dict) -> object:
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.gone = True
            raise CandidateGone(f"more than {MAX_CALLS} calls into the program")
        waiting = self.prefetched.get(json.dumps(message))
        if waiting:
            return self._unpack(message["name"], waiting.popleft())
        if self.gone:
            raise CandidateGone("the program's process has ended")
        answer = self.ask(message)
        if answer is None:
            self.gone = True
            raise CandidateGone("the program's process ended")
        return self._unpack(message["name"], answer)

    def _unpack(self, name: str, answer: dict) -> object:
        if type(answer) is not dict or len(answer) != 1:
            raise CandidateError("malformed answer from the sandbox")
        (kind, body), = answer.items()
        if kind == "ok":
            try:
                return from_plain(body)
            except Unsendable as exc:
                raise CandidateError(f"answer is not plain data: {exc}") from None
        if kind == "callable" and body is True:
            return self.proxy(name)
        if kind == "raise" and type(body) is str:
            raise _exception_named(body)
        if kind == "oom":
            self.oom = True
            raise CandidateError("the program ran out of memory")
        if kind == "exit":
            self.gone = self.exited_cleanly = True
            raise CandidateGone("the program ended its process during a test")
        if kind == "unsendable":
            raise CandidateError(f"the program returned something that is not exact plain data: {body!r}")
        raise CandidateError("malformed answer from the sandbox")

    def proxy(self, name: str) -> "Remote":
        return self._proxies.setdefault(name, Remote(self, name))

    def get(self, name: str) -> object:
        return self._request({"op": "get", "name": name})

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        try:
            plain_args, plain_kwargs = to_plain(list(args)), to_plain(dict(kwargs))
        except Unsendable as exc:
            raise CandidateError(f"a test argument is not plain data: {exc}") from None
        return self._request(call_message(name, plain_args, plain_kwargs))


def call_message(name: str, plain_args: object, plain_kwargs: object) -> dict:
    """The one spelling of a call request (its JSON text is also the key of a prefetched answer)."""
    return {"op": "call", "name": name, "args": plain_args, "kwargs": plain_kwargs}


class Remote:
    """A function of the program, seen from the grader: calling it is one request through the channel."""

    __slots__ = ("_session", "_name")

    def __init__(self, session: Session, name: str) -> None:
        self._session, self._name = session, name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._session.call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<program function {self._name}>"


_NEVER_RERAISED = (StopIteration, StopAsyncIteration)  # would silently end a test's map()/iteration early


def _exception_named(name: str) -> BaseException:
    """The grader's own builtin exception class of that name (so ``except ValueError`` in a test works),
    else CandidateError; never a class the program made, and never one that ends an iteration."""
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception) and not issubclass(found, _NEVER_RERAISED):
        try:
            return found(f"raised by the program ({name})")
        except TypeError:  # e.g. UnicodeDecodeError needs five arguments
            pass
    return CandidateError(f"the program raised {name}")


def _fresh_builtins() -> dict:
    """A copy of the builtins for one job: print is silenced, and `import random` gets a private module so
    tests that draw random cases neither share nor disturb the trainer's global random state."""
    own = dict(vars(builtins))
    private: dict[str, object] = {}

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            if "random" not in private:
                spec = importlib.util.find_spec("random")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                private["random"] = module
            return private["random"]
        return importlib.__import__(name, globals, locals, fromlist, level)

    own["__import__"] = guarded_import
    own["print"] = lambda *args, **kwargs: None
    return own


@functools.lru_cache(maxsize=1024)
def _compile_setup(source: str):
    return compile(source, "<setup>", "exec")


class Grader:
    """The tests of one job, ready to run: trusted setup executed, snippets rewritten and compiled.

    Built before the program starts so the calls with literal arguments can travel with it (`ahead`)."""

    def __init__(self, job: Job, session: Session) -> None:
        self.job, self.session = job, session
        self.notes: list[str] = []
        self.namespace: dict = {"__name__": "__grading__", "__builtins__": _fresh_builtins(),
                                GET: session.get, FN: session.proxy}
        self.setup_ok = True
        try:
            exec(_compile_setup(job.setup), self.namespace)
        except Exception as exc:  # trusted code that fails here fails every test, never passes one
            logger.warning("test setup code failed in the grader (%s: %s); every test fails",
                           type(exc).__name__, exc)
            self.setup_ok = False
        for name in job.entry_points:
            self.namespace[name] = session.proxy(name)
        self.trusted = frozenset(self.namespace)

    def ahead(self) -> list[dict]:
        """Call requests with literal arguments, in test order, to send with the program."""
        if not self.setup_ok:
            return []
        messages = []
        for index, snippet in enumerate(self.job.tests):
            try:
                _, calls, _, _ = prepare(snippet, index, self.trusted)
            except (SyntaxError, ValueError, RecursionError):
                continue  # run() reports it
            for name, args, kwargs in calls:
                try:
                    messages.append(call_message(name, to_plain(list(args)), to_plain(dict(kwargs))))
                except Unsendable:
                    continue
        return messages

    def run(self) -> list[bool]:
        """Evaluate each snippet here; True where it completed. Once the program's process is gone the
        snippets that still need it fail."""
        if not self.setup_ok:
            return [False] * len(self.job.tests)
        results = []
        for index, snippet in enumerate(self.job.tests):
            if self.session.gone and not any(self.session.prefetched.values()):
                results.append(False)  # as if the run had stopped here: nothing left to answer it
                continue
            try:
                code, _, proxied, stdlib = prepare(snippet, index, self.trusted)
            except (SyntaxError, ValueError, RecursionError) as exc:
                logger.warning("test %d cannot be parsed (%s); it fails", index, exc)
                results.append(False)
                continue
            for name in proxied:  # names only ever called: a call proxy each (never trusted names)
                self.namespace[name] = self.session.proxy(name)
            try:
                for name in stdlib:  # the grader's own module (through the job's guarded __import__)
                    self.namespace.setdefault(name, self.namespace["__builtins__"]["__import__"](name))
            except ImportError as exc:
                self.notes.append(f"[grader] test {index} failed: {exc}")
                results.append(False)
                continue
            results.append(_run_one(code, self.namespace, index, self.notes))
        return results


def run_tests(job: Job, session: Session, notes: list[str] | None = None) -> list[bool]:
    """Grade `job`'s tests over an already running program (no calls sent ahead)."""
    grader = Grader(job, session)
    results = grader.run()
    if notes is not None:
        notes.extend(grader.notes)
    return results


def _run_one(code, namespace: dict, index: int, notes: list[str]) -> bool:
    try:
        exec(code, namespace)
    except (Exception, CandidateGone, SystemExit) as exc:
        notes.append(f"[grader] test {index} failed: {type(exc).__name__}: {str(exc)[:200]}")
        return False
    return True


def status_of(program: str, results: list[bool], session: Session) -> str:
    """One of sandbox.STATUSES from what happened: `program` is the harness's report on running the
    program ("ok", "error", "exit", "oom") or "" when none came."""
    end = session.end or {}
    fate = int(end.get("fate", 0))
    if program == "ok" and results and all(results):
        return "passed"
    if end.get("ended") == "timeout" or (end.get("ended") == "exited" and fate in (128 + 9, 128 + 24)):
        return "timeout"  # wall deadline, or killed by the CPU limit (SIGKILL / SIGXCPU)
    if program == "oom" or session.oom:
        return "out_of_memory"
    if program in ("error", "exit"):
        return "failed"
    if end.get("ended") == "exited" and not (session.exited_cleanly and fate == 0):
        return "crashed"
    return "failed" if program == "ok" else "crashed"


def parse_answer(line: bytes) -> dict | None:
    """An answer line's JSON object, or None when it is not one (a malformed answer fails that call)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if type(value) is dict else None


__all__ = ["CandidateError", "CandidateGone", "Grader", "Job", "Remote", "Session", "run_tests", "status_of",
           "parse_answer"]
