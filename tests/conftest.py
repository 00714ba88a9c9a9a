"""Suite-wide fixtures.

Every test session starts from an empty model cache, as a new machine (or CI) would: a warmed model cached by
an earlier run, perhaps built by other code or on a CPU with other kernels, must never decide a verdict. scripts/test.sh
makes one empty cache for its two sessions (SUITE_CACHE_ENV), so the tiny model's warm-up, minutes of one core, is
built once per suite run, not once per session. Set MIRROR_ES_TEST_CACHE=<dir> to opt in to reusing a cache across
sessions (faster local iteration).

scripts/test.sh runs tests/slurm/ in a session of its own (one test after another: they share one cluster whose
nodes some of them take down) beside the rest, which MIRROR_ES_TEST_WORKERS pytest-xdist workers share file by file
(``--dist loadfile``: a file's module fixtures, e.g. a set of training runs, are built once). The workers of one
session share its empty cache (every cache entry is built once under a lock, models/cache.py).

The heavy test files (every core: a whole job, member processes side by side, a vLLM engine) run one after another,
never beside each other, in either session (tests/heavy_lock.py). Time limits follow tests/time_limits.py.

The test files lie in folders that mirror the packages (tests/test_meta/search/ tests meta/search/, ...; tests/docs/ the
docs, tests/scripts/ scripts/ and bench/). The folders are not packages: pytest puts each test file's folder on
sys.path, and this folder with it, so a test imports the modules beside this file (helpers.py: what tests in several
files build, its fixtures loaded below for every test; time_limits.py, conf_groups.py, ...) by their plain names, and
every test file's name is unique across tests/ (pytest refuses a second one of a name).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

logger = logging.getLogger(__name__)

#: an empty model cache that scripts/test.sh makes for both of its sessions (each entry is built once under a lock)
SUITE_CACHE_ENV = "MIRROR_ES_SUITE_CACHE"

#: the files that take longest (minutes: a set of training runs, vLLM members, the whole main job), measured with
#: ``--durations``, as paths under tests/, started first: the workers share files in collection order
#: (scripts/test.sh passes ``--no-loadscope-reorder``), so a long file never starts last while the other worker sits
#: idle. The first, the learning runs (two single-threaded processes), is one worker's first unit; the next three are
#: the heavy files (tests/heavy_lock.py), which the other worker runs in turn as one unit; then both take the rest
LONGEST_FIRST = (
    "test_inner_loop/member/test_inner_learning.py", "test_inner_loop/generation/test_vllm_member.py",
    "test_meta/search/test_meta_e2e.py", "scripts/test_gpu_check.py", "test_meta/search/test_meta_run_paths.py",
    "test_inner_loop/process/test_numerics.py", "scripts/test_bench_member_gpu.py",
    "test_inner_loop/member/test_inner_member.py", "test_inner_loop/numerics/test_fingerprint.py",
)
#: heavy tests one at a time, across workers and sessions; the shared builders' fixtures for every test
pytest_plugins = ["heavy_lock", "helpers"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FIRST, in its order), the rest as collected. A listed file that no longer exists
    is an error, so the list follows moves and renames."""
    here = Path(__file__).resolve().parent
    missing = [name for name in LONGEST_FIRST if not (here / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names missing files: {missing}")
    rank = {here / name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def fresh_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """MIRROR_ES_CACHE for the whole session (subprocesses and SLURM jobs inherit it): a new empty directory."""
    reuse = os.environ.get("MIRROR_ES_TEST_CACHE")
    if reuse:
        path = Path(reuse).resolve()
    elif os.environ.get(SUITE_CACHE_ENV):  # this suite run's own, empty when scripts/test.sh made it
        path = Path(os.environ[SUITE_CACHE_ENV]).resolve()
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for the session's workers: beside their temp dirs
        path = tmp_path_factory.getbasetemp().parent / "model-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("model-cache")
    if reuse:
        logger.warning("reusing the model cache %s (MIRROR_ES_TEST_CACHE)", path)
    old = os.environ.get("MIRROR_ES_CACHE")
    os.environ["MIRROR_ES_CACHE"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("MIRROR_ES_CACHE", None)
        else:
            os.environ["MIRROR_ES_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def fork_server_for_session(fresh_model_cache: Path) -> Iterator[None]:
    """One fork server per session (inner_loop/process/fork_server.py), as a local search has one: every pinned member
    a test starts is forked from it without ~7 CPU-s of imports; one it cannot serve starts a fresh interpreter. A
    forked member's CPU time is its server's child's, not the test's (MIRROR_ES_TEST_CPU_LOG does not see it)."""
    from inner_loop.process.fork_server import serving

    with serving():
        yield


#: a file to which each test's CPU seconds are appended (its own process and the children it waited for: members,
#: CLIs, probes; not SLURM jobs, which slurmd runs), one JSON line per test: where the suite's CPU goes
CPU_LOG_ENV = "MIRROR_ES_TEST_CPU_LOG"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With CPU_LOG_ENV set, the CPU seconds of each test's setup, call and teardown (module fixtures included in the
    first test that builds them)."""
    path = os.environ.get(CPU_LOG_ENV)
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    start_cpu, start_wall = cpu(), time.monotonic()
    yield
    line = {"test": item.nodeid, "cpu_s": round(cpu() - start_cpu, 2), "wall_s": round(time.monotonic() - start_wall, 2)}
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
