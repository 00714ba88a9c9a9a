"""The contract between the outer loop and the code a member runs: ``MemberProgram``.

Why a class: meta asks a member's code more than "train this member": whether an inner config can run at all, before
anything is written or submitted; what to stage from the hub and how a config reads the staged copies; whether this
host can run members; what to tidy once a member is settled for good. One class names all of it, with defaults for a
program that needs none of it (a synthetic objective), so meta calls methods where it would otherwise guess. It sits
beside the records and imports nothing else of the project, so meta, launch and the inner loop all import it and
none of them imports another.

``inner.entrypoint`` (``package.module:attr``) names the program; ``as_program`` turns what it names into one: a
program itself; a module-level function that an earlier version stored as the entry point and that its module
declares a name of its program (``named_by``), so a search started then resumes and its queued jobs run; or any
other callable ``fn(spec) -> record``, a program with no hooks.
"""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping, TypeVar

from core.records import MemberSpec, ResultRecord

F = TypeVar("F", bound=Callable[..., Any])


class MemberProgram(abc.ABC):
    """What meta asks of the code that trains and scores one member. Subclass it and name an instance in
    ``inner.entrypoint``; only ``train`` is required. Stateless: a job loads it again in its own process."""

    @abc.abstractmethod
    def train(self, spec: MemberSpec, save_final: bool = False) -> ResultRecord | Mapping[str, Any]:
        """Train and score one member; its record (or the record's dict). Idempotent: a member runs again after a
        requeue, a retry or a resume, so a finished member returns its record and a partial one resumes.
        ``save_final``: keep the trained model too (a single run; a search member's outcome is its record)."""

    def validate(self, inner: Mapping[str, Any]) -> None:
        """ValueError (or FileNotFoundError) naming the key when a member of ``inner`` could not run: meta calls it
        before anything is written or submitted, so a bad config fails once, not in every member. Default: nothing
        to check."""

    def finalize(self, spec: MemberSpec) -> None:
        """The member is settled for good (no retry will come): drop what was kept only for a retry. Meta calls it
        once per member when its generation closes; a failure is logged, never fatal. Default: nothing kept."""

    def stage(self, inner: Mapping[str, Any], **options: Any) -> list[dict[str, Any]] | None:
        """The hub repositories members of ``inner`` read, each looked up in the stage cache: a list of
        ``StagePin.as_dict`` (core/stage_pins.py), staged or missing with the reason, never raising for a
        missing one. ``options``: ``cache_dir``, ``revisions`` (per repository, when nothing is pinned yet), ``pins``
        (an earlier staging's, which a resume must match), ``fetch`` (download what is missing), ``model_patterns``.
        None (the default): the program reads nothing from the hub, and the run's manifest keeps no pins."""
        return None

    def use_staged(self, inner: Mapping[str, Any], pins: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """``inner`` reading the staged copies that ``pins`` hold instead of the hub's names: for configs composed
        after staging (a reporting row's transfer task, a tuning trial). Default: ``inner`` unchanged."""
        return dict(inner)

    def preflight(self, inner: Mapping[str, Any], directory: str | Path, probe_sandbox: bool) -> None:
        """ValueError naming this host and the cause when members of ``inner`` could not run from here: what they
        read is readable, ``directory`` has room. ``probe_sandbox``: the members run on this host too (a local
        launcher), so what they run on a node can be probed here. Default: nothing to check."""

    def hosting_here(self, inner: Mapping[str, Any]) -> ContextManager[Any] | None:
        """What members of ``inner`` share on this machine while a launcher runs them here (``launcher=local`` or
        ``debug``): a context the launcher enters at its first submission and leaves at its close. Asked once per
        entry point, with its first members' config. The inner loop's: a fork server that saves each pinned member
        its imports (inner_loop/process/fork_server.py). Default: None, nothing shared."""
        return None


class FunctionProgram(MemberProgram):
    """A plain ``fn(spec) -> record`` as a program without hooks: the simplest entry point a user may name."""

    def __init__(self, fn: Callable[[MemberSpec], Any]) -> None:
        self.fn = fn

    def train(self, spec: MemberSpec, save_final: bool = False) -> ResultRecord | Mapping[str, Any]:
        """``fn(spec)``: a plain function keeps no trained model, so ``save_final`` has nothing to keep."""
        return self.fn(spec)

    def __eq__(self, other: object) -> bool:
        """Two loads of one function are one program (a resumed run's entry point compared with today's)."""
        return isinstance(other, FunctionProgram) and other.fn is self.fn

    def __hash__(self) -> int:
        return id(self.fn)

    def __repr__(self) -> str:
        return f"FunctionProgram({getattr(self.fn, '__qualname__', self.fn)!r})"


#: module-level functions that stand for a program (``named_by``), by the function object itself
_NAMES: dict[Callable[..., Any], MemberProgram] = {}


def named_by(program: MemberProgram) -> Callable[[F], F]:
    """Decorator: the function is a name of ``program``, kept because an earlier version stored it as
    ``inner.entrypoint`` (a search's config.yaml, its queued jobs' arguments) or code calls it directly. The loader
    then gets ``program`` with its hooks from that name; the function itself stays as it is (pickled by name)."""
    def declare(fn: F) -> F:
        _NAMES[fn] = program
        return fn

    return declare


def as_program(target: Any, entrypoint: str) -> MemberProgram:
    """The program ``inner.entrypoint`` (``entrypoint``) names, from the object it resolved to; ValueError naming
    the entry point when that cannot be one."""
    if isinstance(target, MemberProgram):
        return target
    if isinstance(target, type):
        kind = "a MemberProgram class" if issubclass(target, MemberProgram) else "a class"
        raise ValueError(f"inner.entrypoint {entrypoint!r} names {kind}: name an instance of it "
                         f"(`program = {target.__name__}()` in its module)")
    if not callable(target):
        raise ValueError(f"inner.entrypoint {entrypoint!r} is neither a MemberProgram nor callable")
    try:
        return _NAMES[target]
    except (KeyError, TypeError):  # TypeError: an unhashable callable is nobody's name
        return FunctionProgram(target)
