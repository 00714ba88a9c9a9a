"""Suite-wide fixtures.

Every test session starts from an empty model cache, as a new machine (or CI) would: a warmed model cached by
an earlier run, perhaps built by other code or on a CPU with other kernels, must never decide a verdict. Set
MIRROR_ES_TEST_CACHE=<dir> to opt in to reusing a cache across sessions (faster local iteration).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

logger = logging.getLogger(__name__)


@pytest.fixture(scope="session", autouse=True)
def fresh_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """MIRROR_ES_CACHE for the whole session (subprocesses and SLURM jobs inherit it): a new empty directory."""
    reuse = os.environ.get("MIRROR_ES_TEST_CACHE")
    path = Path(reuse).resolve() if reuse else tmp_path_factory.mktemp("model-cache")
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
