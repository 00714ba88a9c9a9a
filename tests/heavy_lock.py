"""A pytest plugin: tests marked ``heavy`` run one at a time, across pytest-xdist workers and sessions.

Why: a heavy test takes every core (a whole job, member processes side by side, a vLLM engine threading over the
machine). Two side by side on two cores, with the SLURM session's jobs beside them, ran each three times slower,
past the limits they then had, and finished no sooner than one after the other. Each takes an exclusive lock on the
file HEAVY_LOCK_ENV names for its whole run (setup to teardown, so a module fixture's training runs too);
scripts/test.sh names one for both of its sessions, else a session's first process names one that its xdist
workers inherit. Standard library and pytest only.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

#: the environment variable naming the file heavy tests lock
HEAVY_LOCK_ENV = "MIRROR_ES_HEAVY_LOCK"
_OWN_LOCK = "_mirror_es_own_heavy_lock"


def pytest_configure(config: pytest.Config) -> None:
    """The session's first process names the lock file, which its xdist workers inherit, and removes it at the end."""
    config.addinivalue_line("markers", "heavy: takes every core; never beside another heavy test (tests/heavy_lock.py)")
    if not os.environ.get(HEAVY_LOCK_ENV) and not hasattr(config, "workerinput"):
        path = Path(tempfile.gettempdir()) / f"mirror-es-heavy-{os.getpid()}.lock"
        os.environ[HEAVY_LOCK_ENV] = str(path)
        setattr(config, _OWN_LOCK, path)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, _OWN_LOCK, None)
    if path is not None:
        path.unlink(missing_ok=True)
        os.environ.pop(HEAVY_LOCK_ENV, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A heavy test runs holding the lock (released when its file closes, or when its process dies)."""
    if item.get_closest_marker("heavy") is None:
        yield
        return
    with open(os.environ[HEAVY_LOCK_ENV], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
