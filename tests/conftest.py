"""Suite-wide fixtures.

Every test session starts from an empty model cache, as a new machine (or CI) would: a warmed model cached by
an earlier run, perhaps built by other code or on a CPU with other kernels, must never decide a verdict. Set
MIRROR_ES_TEST_CACHE=<dir> to opt in to reusing a cache across sessions (faster local iteration).

scripts/test.sh runs tests/slurm/ in a session of its own (one test after another: they share one cluster whose
nodes some of them take down) beside the rest, which MIRROR_ES_TEST_WORKERS pytest-xdist workers share file by file
(``--dist loadfile``: a file's module fixtures, e.g. a set of training runs, are built once). The workers of one
session share its empty cache (every cache entry is built once under a lock, models/cache.py).

The heavy test files (every core: a whole job, member processes side by side, a vLLM engine) run one after another,
never beside each other, in either session (tests/heavy_lock.py). Time limits follow tests/time_limits.py.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

logger = logging.getLogger(__name__)

#: the files that take longest (minutes: a set of training runs, vLLM members, the whole main job), measured with
#: ``--durations``, started first: the workers share files in collection order (scripts/test.sh passes
#: ``--no-loadscope-reorder``), so a long file never starts last while the other worker sits idle. The first, the
#: learning runs (two single-threaded processes), is one worker's first unit; the next three are the heavy files
#: (tests/heavy_lock.py), which the other worker runs in turn as one unit; then both take the rest
LONGEST_FIRST = (
    "test_inner_learning.py", "test_vllm_member.py", "test_meta_e2e.py", "test_gpu_check.py", "test_meta_run_paths.py",
    "test_numerics.py", "test_bench_member_gpu.py", "test_inner_member.py", "test_fingerprint.py",
)
#: heavy tests one at a time, across workers and sessions
pytest_plugins = ["heavy_lock"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FIRST, in its order), the rest as collected. A listed file that no longer exists
    is an error, so the list follows renames."""
    here = Path(__file__).resolve().parent
    missing = [name for name in LONGEST_FIRST if not (here / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names missing files: {missing}")
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)) if item.path.parent == here else len(rank))


@pytest.fixture(scope="session", autouse=True)
def fresh_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """MIRROR_ES_CACHE for the whole session (subprocesses and SLURM jobs inherit it): a new empty directory."""
    reuse = os.environ.get("MIRROR_ES_TEST_CACHE")
    if reuse:
        path = Path(reuse).resolve()
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
