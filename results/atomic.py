"""Crash-safe file writes and checksum-verified reads.

Every state file of a run goes through here so that a kill -9 at any instant leaves either the old file or the
new one, never half of one, and so that a corrupted file is detected on read instead of silently used.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CHECKSUM_SUFFIX = ".sha256"


class CorruptFileError(ValueError):
    """A state file is missing its checksum, fails it, or cannot be parsed."""


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via temp file + fsync + os.replace (readers never see a partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """JSON with allow_nan=False: a NaN in a record is a bug, not something to persist."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_with_checksum(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` and a ``<path>.sha256`` beside it; the data file is replaced first, the checksum last.

    A crash between the two leaves a data file whose checksum does not match, which readers treat as corrupt
    and skip (falling back to an older state), so the pair is never trusted half-written.
    """
    path = Path(path)
    atomic_write_bytes(path, data)
    atomic_write_text(path.with_name(path.name + CHECKSUM_SUFFIX), sha256_bytes(data) + "\n")
    return path


def read_with_checksum(path: str | os.PathLike) -> bytes:
    """Return the bytes of ``path`` after checking them against ``<path>.sha256``; CorruptFileError otherwise."""
    path = Path(path)
    sidecar = path.with_name(path.name + CHECKSUM_SUFFIX)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise CorruptFileError(f"{path}: file is missing") from exc
    try:
        expected = sidecar.read_text().strip()
    except FileNotFoundError as exc:
        raise CorruptFileError(f"{path}: checksum file {sidecar.name} is missing") from exc
    actual = sha256_bytes(data)
    if actual != expected:
        raise CorruptFileError(f"{path}: checksum mismatch (expected {expected[:12]}..., got {actual[:12]}...)")
    return data
