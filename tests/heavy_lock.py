"""A pytest plugin: the heavy test files run one after another, never beside each other, in either of
scripts/test.sh's sessions.

Why: a heavy file takes every core (a whole job, member processes side by side, a vLLM engine threading over the
machine). Two side by side on two cores, with the SLURM session's jobs beside them, ran each three times slower,
past the limits they then had, and finished no sooner than one after the other. So:

- within a session, pytest-xdist's ``--dist loadfile`` gives the heavy files to one worker as one unit (their own
  scope), which runs them in turn while the other workers take the light files: no worker waits for another;
- across sessions (the SLURM session's rehearsal), each heavy test holds an exclusive lock on the file HEAVY_LOCK_ENV
  names for its run (setup to teardown, so a module fixture's training runs too); scripts/test.sh names one for both
  sessions, else a session's first process names one that its xdist workers inherit.

Not heavy in that sense: tests/test_inner_loop/member/test_inner_learning.py, the longest file, trains its runs two at a
time, each one pinned, single-threaded process, so it never takes more than the two cores a pair of light workers
takes. It runs as a unit of its own beside the heavy files (the suite's longest two units at once, from its start),
not after them: run after them it made the heavy worker's queue the suite's whole wall time.

Standard library, pytest and (where installed) pytest-xdist only.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

#: the test files that take every core, by file name (a test file's name is unique across tests/: tests/conftest.py)
HEAVY_FILES = ("test_vllm_member.py", "test_meta_e2e.py", "test_gpu_check.py", "test_slurm_rehearsal.py")
#: the environment variable naming the file heavy tests lock
HEAVY_LOCK_ENV = "MIRROR_ES_HEAVY_LOCK"
#: pytest-xdist's work unit of every heavy file
HEAVY_SCOPE = "heavy files"
_OWN_LOCK = "_mirror_es_own_heavy_lock"


def is_heavy(nodeid: str) -> bool:
    """Whether the test ``nodeid`` ('tests/test_meta/search/test_x.py::test_y') is in a heavy file."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in HEAVY_FILES


def pytest_configure(config: pytest.Config) -> None:
    """The session's first process names the lock file, which its xdist workers inherit, and removes it at the end."""
    if not os.environ.get(HEAVY_LOCK_ENV) and not hasattr(config, "workerinput"):
        path = Path(tempfile.gettempdir()) / f"mirror-es-heavy-{os.getpid()}.lock"
        os.environ[HEAVY_LOCK_ENV] = str(path)
        setattr(config, _OWN_LOCK, path)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, _OWN_LOCK, None)
    if path is not None:
        path.unlink(missing_ok=True)
        os.environ.pop(HEAVY_LOCK_ENV, None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the heavy files as one unit of work (one worker runs them in turn)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return HEAVY_SCOPE if is_heavy(nodeid) else super()._split_scope(nodeid)

    return HeavyFilesTogether(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A heavy test runs holding the lock (released when its file closes, or when its process dies)."""
    if not is_heavy(item.nodeid):
        yield
        return
    with open(os.environ[HEAVY_LOCK_ENV], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
