"""The on-disk cache of built models: where it lives, how entries are named, and building an entry exactly once.

TRL reloads the reference model by path when beta > 0, and concurrent population members must share one copy,
so every model we build (the tiny model, SmolLM2 from its GGUF, a warmed-up policy) is a directory in this cache.
Directories are built in a temp dir beside the cache and renamed into place: concurrent builders race harmlessly
(the loser discards its copy).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from core.file_lock import FileLock

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    """Where built models live: $MIRROR_ES_CACHE, else ~/.cache/mirror-es."""
    return Path(os.environ.get("MIRROR_ES_CACHE") or Path.home() / ".cache" / "mirror-es")


def config_digest(payload: object) -> str:
    """Short stable hash of a JSON-serialisable payload, used to name cache entries."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_once(final_dir: Path, build: Callable[[Path], None]) -> Path:
    """Create ``final_dir`` by ``build(tmp_dir)`` then an atomic rename; safe when processes race.

    A lock file beside the directory (``core.file_lock``: with or without flock, across hosts) makes
    concurrent members wait for one builder instead of all spending the same minute of CPU (where even the lock
    file cannot be created, the rename still keeps the result whole: the loser discards its copy). A complete
    directory is recognised by its ``.complete`` marker, written last inside the temp dir, so a crashed builder
    never leaves a half-built model.
    """
    if (final_dir / ".complete").is_file():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(final_dir.parent / f".{final_dir.name}.lock", owner="model builder")
    try:
        lock.acquire()
    except OSError as exc:
        logger.warning("could not lock %s (%s); building without a lock", final_dir, exc)
    try:
        if (final_dir / ".complete").is_file():
            return final_dir
        _build_and_rename(final_dir, build)
    finally:
        lock.release()
    return final_dir


def _build_and_rename(final_dir: Path, build: Callable[[Path], None]) -> None:
    # not mkdtemp (always 0700): the cache is shared by every member, so the umask decides who may read it
    tmp = final_dir.parent / f".{final_dir.name}.{uuid.uuid4().hex[:12]}"
    tmp.mkdir(mode=0o777)
    try:
        build(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, final_dir)
            logger.info("built %s", final_dir)
        except OSError:
            if not (final_dir / ".complete").is_file():
                # A stale, incomplete directory from a crashed builder: replace it.
                shutil.rmtree(final_dir, ignore_errors=True)
                os.rename(tmp, final_dir)
            else:
                logger.info("another process built %s first; discarding this copy", final_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
