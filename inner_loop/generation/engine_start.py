"""One vLLM engine start at a time on a shared GPU: a node-local lock keyed by the physical card.

Why: a colocated vLLM engine decides its memory at start-up from the whole device: it refuses to start when the
card's free memory is below its ``gpu_memory_utilization`` of the card, and it sizes its KV cache from how much the
device's used memory grew while it profiled a forward pass. Members that share one GPU (resources.members_per_gpu
>= 2) and start their engines together would each count the others' loading and profiling as their own, and start
with too small a cache or not at all. So a member holds this lock while its trainer builds its engine, and the
other members of the card wait for their turn.

The lock is ``fcntl.flock`` on a file in a node-local folder that every job on the node shares: the members of one
card are on one node, and flock is released by the kernel when its holder dies, so a member killed mid-start never
blocks the others (the run directory's lock lives on shared storage, where flock is not to be trusted, and is not for
this). Not the temp dir: SLURM's job_container/tmpfs and many sites give each job a private /tmp and TMPDIR, so
members of two jobs on one card (``launcher.gpu_sharing: shard``) would each lock a file of their own.
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
#: a folder of the site's choosing for the lock (node-local, shared by every job on the node)
LOCK_DIR_ENV = "MIRROR_ES_NODE_LOCK_DIR"
#: node-local folders shared by every job, in order: /run/lock (world-writable, sticky) is not made private by
#: job_container/tmpfs, which by default isolates /tmp and /dev/shm; /dev/shm where /run/lock is not writable
NODE_LOCK_DIRS = ("/run/lock", "/var/lock", "/dev/shm")


def node_lock_dir() -> Path:
    """Where a card's engine-start lock lives: $MIRROR_ES_NODE_LOCK_DIR, else the first writable of NODE_LOCK_DIRS,
    else the temp dir (with a warning: it may be private to this job)."""
    chosen = os.environ.get(LOCK_DIR_ENV)
    if chosen:
        return Path(chosen)
    for folder in NODE_LOCK_DIRS:
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return Path(folder)
    fallback = Path(tempfile.gettempdir())
    logger.warning("vLLM engine start: none of %s is writable here; the lock is in %s, which may be private to this "
                   "job (set %s to a node-local folder every job shares)", ", ".join(NODE_LOCK_DIRS), fallback,
                   LOCK_DIR_ENV)
    return fallback


def engine_start_lock_path(gpu_key: str, directory: str | Path | None = None) -> Path:
    """The lock file of the card ``gpu_key`` (its UUID) in ``directory`` (by default ``node_lock_dir()``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", gpu_key)
    return Path(directory if directory is not None else node_lock_dir()) / f"{LOCK_PREFIX}{safe}.lock"


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
