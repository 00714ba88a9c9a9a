"""Crash-safe file writes and checksum-verified reads.

Every state file of a run goes through here so that a kill -9 at any instant leaves either the old file or the
new one, never half of one, and so that a corrupted file is detected on read instead of silently used.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

CHECKSUM_SUFFIX = ".sha256"


class CorruptFileError(ValueError):
    """A state file is missing its checksum, fails it, or cannot be parsed."""


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file under ``folder`` and every directory of it: a folder filled by a copy (a checkpoint) is on
    disk before the rename that publishes it, as atomic_write_bytes makes one file."""
    root = Path(folder)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in [*sorted(p for p in root.rglob("*") if p.is_dir()), root]:
        _fsync_dir(directory)


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory's entries (a rename in it), where the filesystem allows."""
    _fsync_dir(Path(directory))


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


def _write_synced(fd: int, data: bytes) -> None:
    """Write ``data`` to the open descriptor ``fd`` (closed afterwards) and fsync it."""
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _temp_beside(path: Path, suffix: str) -> tuple[int, str]:
    """An open, new, hidden file beside ``path``, created with mode 0666 so the kernel applies the umask: a run's
    files are as readable as the user's own (group-readable under 0022), not mkstemp's owner-only 0600."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via temp file + fsync + os.replace (readers never see a partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, ".tmp")
    try:
        _write_synced(fd, data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


#: link() errors that mean "this filesystem has no hard links": fall back to an O_EXCL create
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK)


def atomic_create_bytes(path: str | os.PathLike, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if nothing exists there; True if this call created it.

    The data is written and fsynced under a temp name, then hard-linked to ``path``: link() fails if the name
    exists, and that check is the file server's, not a client cache's, so a file another host just wrote and
    this host cannot see yet is still never replaced. Where hard links are not supported an O_EXCL create is
    the fallback (equally exclusive; a reader may briefly see a partial file there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, ".create.tmp")
    try:
        _write_synced(fd, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            return _create_exclusive(path, data)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    _fsync_dir(path.parent)
    return True


def _create_exclusive(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    _write_synced(fd, data)
    _fsync_dir(path.parent)
    return True


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    """JSON with allow_nan=False: a NaN in a record is a bug, not something to persist."""
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_bytes(path, json_bytes(obj))


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
