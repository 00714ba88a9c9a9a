"""Rewriting a dataset's test snippets so every use of the program goes through the grading channel.

Why: the tests come from the dataset (trusted) and run in the trusted grader; only the names the program
defines (the function under test, or a module-level value) live in the sandbox. Each such name in a test is
rewritten: ``f(args)`` becomes ``__grading_fn__("f")(args)`` (one call through the channel, arguments sent as
plain data) and any other read of ``v`` becomes ``__grading_get__("v")`` (its value as plain data, or a
callable proxy when it is a function). Where every use is a call (the MBPP form) the snippet is left as it is
and the grader binds the name to a call proxy instead, which is the same thing, cheaper. Everything else in the test - comparisons, loops, ``abs``,
``math.isclose``, helpers from the trusted prompt - is evaluated by the grader with its own builtins.
"""
from __future__ import annotations

import ast
import builtins
import functools
import sys

GET = "__grading_get__"
FN = "__grading_fn__"


_BUILTIN_NAMES = frozenset(vars(builtins))
#: A test that names a standard-library module it never imports (MBPP's `math.isclose(...)` relies on the
#: program's `import math`) gets the GRADER's own module: never the program's, which the program could swap.
_STDLIB_NAMES = frozenset(sys.stdlib_module_names)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _scan(tree: ast.AST) -> tuple[set[str], set[str], list[ast.Call]]:
    """One walk: names read, names bound anywhere (assignments, defs, parameters, imports, handlers), and
    calls of plain names."""
    loads: set[str] = set()
    bound: set[str] = set()
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.append(node)
        elif isinstance(node, _SCOPES):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return loads, bound, calls


class _RouteToProgram(ast.NodeTransformer):
    def __init__(self, remote: set[str]) -> None:
        self.remote = remote

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id in self.remote:
            node.args = [self.visit(arg) for arg in node.args]
            node.keywords = [self.visit(keyword) for keyword in node.keywords]
            node.func = _located(ast.Call(ast.Name(FN, ast.Load()), [ast.Constant(node.func.id)], []), node.func)
            return node
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.remote:
            return _located(ast.Call(ast.Name(GET, ast.Load()), [ast.Constant(node.id)], []), node)
        return node


def _located(new: ast.Call, old: ast.AST) -> ast.Call:
    for node in (new, new.func, *new.args):
        ast.copy_location(node, old)
    return new


def _literal_args(call: ast.Call) -> tuple | None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        return (tuple(ast.literal_eval(a) for a in call.args),
                tuple((k.arg, ast.literal_eval(k.value)) for k in call.keywords))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


@functools.lru_cache(maxsize=4096)  # a GRPO group grades many completions against the same tests
def prepare(snippet: str, index: int, trusted: frozenset[str]) -> tuple:
    """(code object of the rewritten snippet, its literal calls into the program in source order as
    (name, args, kwargs items), names to bind to call proxies instead of rewriting, standard-library module
    names the snippet uses without importing them). Raises SyntaxError
    for a broken dataset test.

    Why the literal calls: MBPP asserts are ``assert f(<literals>) == <expected>``; those calls can go to
    the sandbox with the program and be answered in one round trip. Only arguments travel, never the test.
    """
    tree = ast.parse(snippet, f"<test {index}>", "exec")
    loads, bound, calls = _scan(tree)
    if {GET, FN} & (loads | bound):
        raise SyntaxError(f"test {index} uses a reserved grading name")
    free = loads - bound - trusted - _BUILTIN_NAMES
    stdlib = frozenset(free & _STDLIB_NAMES)
    remote = free - stdlib
    remote_calls = [c for c in calls if c.func.id in remote]
    ahead = []
    for call in sorted(remote_calls, key=lambda c: (c.lineno, c.col_offset)):
        literal = _literal_args(call)
        if literal is not None:
            ahead.append((call.func.id, *literal))
    called = {c.func.id for c in remote_calls}
    if called == remote and _name_loads(tree, remote) == len(remote_calls):
        # every use is a call (the MBPP form): the grader binds these names to call proxies, no rewrite
        return compile(tree, f"<test {index}>", "exec"), tuple(ahead), frozenset(called), stdlib
    code = compile(_RouteToProgram(remote).visit(tree), f"<test {index}>", "exec")
    return code, tuple(ahead), frozenset(), stdlib


def _name_loads(tree: ast.AST, names: set[str]) -> int:
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names)
