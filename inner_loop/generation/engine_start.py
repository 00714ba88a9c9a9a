"""One vLLM engine start at a time on a shared GPU: a node-local lock keyed by the physical card.

Why: a colocated vLLM engine decides its memory at start-up from the whole device: it refuses to start when the
card's free memory is below its ``gpu_memory_utilization`` of the card, and it sizes its KV cache from how much the
device's used memory grew while it profiled a forward pass. Members that share one GPU (resources.members_per_gpu
>= 2) and start their engines together would each count the others' loading and profiling as their own, and start
with too small a cache or not at all. So a member holds this lock while its trainer builds its engine, and the
other members of the card wait for their turn.

The lock is ``fcntl.flock`` on a file in the node's temp dir: the members of one card are on one node, and flock is
released by the kernel when its holder dies, so a member killed mid-start never blocks the others (the run
directory's lock lives on shared storage, where flock is not to be trusted, and is not for this).
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

#: the lock file's name before the card's key; one file per physical GPU of the node
LOCK_PREFIX = "mirror-es-vllm-start-"


def engine_start_lock_path(gpu_key: str, directory: str | Path | None = None) -> Path:
    """The lock file of the card ``gpu_key`` (its UUID) in ``directory`` (the node's temp dir by default)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", gpu_key)
    return Path(directory if directory is not None else tempfile.gettempdir()) / f"{LOCK_PREFIX}{safe}.lock"


@contextmanager
def engine_start_turn(gpu_key: str, directory: str | Path | None = None) -> Iterator[None]:
    """Hold the card's engine-start lock for the body; wait (logging that it waits) while another member holds it.

    The file is opened read-only (flock needs no write access), so members of different users can share a card.
    """
    path = engine_start_lock_path(gpu_key, directory)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("vLLM engine start: another member of GPU %s is starting its engine; waiting for its turn "
                        "(%s)", gpu_key, path)
            waited = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            logger.info("vLLM engine start: its turn on GPU %s after %.1f s", gpu_key, time.monotonic() - waited)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
