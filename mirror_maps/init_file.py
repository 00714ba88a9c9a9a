"""Mirror-map init files: the 380-long search vector plus provenance metadata, in one safetensors file.

Why safetensors: it is the ecosystem's weight format (Hugging Face checkpoints use it), it holds no pickle,
so reading a file never runs code, and its header is plain JSON, so anyone can see what a file is with
``safetensors.safe_open(path, "pt").metadata()`` without this package. The file holds one float64 tensor
``vector`` (layout below) and string metadata: ``format`` (FILE_FORMAT), ``layout_version``,
``param_transform`` and ``provenance`` (the caller's metadata dict as a JSON object).

load_init also reads the earlier torch format (a dict {"format", "layout_version", "vector",
"metadata_json"} from torch.save, read with weights_only=True). The format is decided by the file's content,
never its name, so ``best.pt``, ``best.safetensors`` and ``best`` all work. Files are written to a temporary
file in the same directory, fsynced and moved into place, so a crash never leaves half a file under the name.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import uuid
from pathlib import Path
from typing import IO, Any

import safetensors.torch
import torch

from mirror_maps.neural import PARAM_TRANSFORMS, VECTOR_LENGTH, NeuralMirrorMap

logger = logging.getLogger(__name__)

FILE_FORMAT = "mirror-es/neural-mirror-init"
LAYOUT_VERSION = 1
"""Version 1: [v(126), w(126), b(126), a, c]; blocks u^3, u^2, sqrt, cbrt, log(u+ + 1e-3), exp."""
VECTOR_KEY = "vector"
RESERVED_KEYS = ("layout_version", "param_transform")
_MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip container; its older pickle format


def _atomic_write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # not mkstemp (always 0600): created 0666 so the umask decides, as for any file the user writes
    temp_name = str(path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    handle = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp_name, path)
    except BaseException:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
        raise


def save_init(path: str | os.PathLike, mirror_map: NeuralMirrorMap, metadata: dict[str, Any] | None = None) -> Path:
    """Write the map's search vector and metadata (provenance: run, generation, fitness...) to `path`.

    load_init returns `metadata` plus layout_version and param_transform; `metadata` must be
    JSON-serialisable and may not hold those two keys. Any file name works; ``.safetensors`` is the natural one.
    """
    path = Path(path)
    provenance = dict(metadata or {})
    for reserved in RESERVED_KEYS:
        if reserved in provenance:
            raise ValueError(f"metadata key {reserved!r} is written by save_init itself; remove it")
    try:
        provenance_json = json.dumps(provenance, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata for {path} is not JSON-serialisable: {error}") from error
    vector = mirror_map.to_vector()
    if not torch.isfinite(vector).all():
        raise ValueError(f"refusing to write {path}: the mirror-map vector contains NaN or inf")
    header = {
        "format": FILE_FORMAT,
        "layout_version": str(LAYOUT_VERSION),
        "param_transform": mirror_map.param_transform,
        "provenance": provenance_json,
    }
    payload = safetensors.torch.save({VECTOR_KEY: vector.detach().to(torch.float64).cpu().contiguous()}, header)
    _atomic_write(path, payload)
    logger.debug("wrote mirror-map init file %s (%s)", path, mirror_map.param_transform)
    return path


def load_init(path: str | os.PathLike) -> tuple[NeuralMirrorMap, dict[str, Any]]:
    """Read an init file written by save_init (safetensors, or the earlier torch format) ->
    (map with the stored transform, metadata dict with layout_version and param_transform added).

    Raises FileNotFoundError for a missing file and ValueError naming the file and the problem for anything else.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mirror-map init file {path} does not exist")
    with path.open("rb") as stream:
        header = _safetensors_header(path, stream)
        stream.seek(0)
        if header is not None:
            vector, transform, metadata = _read_safetensors(path, stream, header)
        elif stream.read(4).startswith(_TORCH_MAGIC):
            stream.seek(0)
            vector, transform, metadata = _read_torch(path, stream)
        else:
            problem = "the file is empty" if path.stat().st_size == 0 else "neither a safetensors nor a torch file"
            raise _unreadable(path, problem)
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or vector.numel() != VECTOR_LENGTH:
        shape = list(vector.shape) if isinstance(vector, torch.Tensor) else type(vector).__name__
        raise ValueError(f"{path} holds a vector of shape {shape}; a mirror-map vector has {VECTOR_LENGTH} numbers")
    if not vector.is_floating_point() or not torch.isfinite(vector).all():
        raise ValueError(f"{path} holds a vector with NaN/inf or a non-float dtype")
    if transform not in PARAM_TRANSFORMS:
        raise ValueError(f"{path} has param_transform {transform!r}; expected one of {PARAM_TRANSFORMS}")
    metadata.update(layout_version=LAYOUT_VERSION, param_transform=transform)
    return NeuralMirrorMap.from_vector(vector, param_transform=transform), metadata


def _unreadable(path: Path, problem: str) -> ValueError:
    return ValueError(f"{path} is not a readable mirror-map init file ({problem})")


def _check_version(path: Path, version: object) -> None:
    if str(version) != str(LAYOUT_VERSION):
        raise ValueError(f"{path} has layout_version {version}; this code reads only version {LAYOUT_VERSION}")


def _safetensors_header(path: Path, stream: IO[bytes]) -> dict[str, Any] | None:
    """The parsed JSON header if the file looks like safetensors (u64 little-endian length, then a JSON
    object), else None; ValueError if such a header is cut short or corrupt. Torch zip and pickle files never
    pass: their first 8 bytes read as a length far beyond the limit."""
    size = os.fstat(stream.fileno()).st_size
    prefix = stream.read(8)
    if len(prefix) < 8:
        return None
    (length,) = struct.unpack("<Q", prefix)
    if not (2 <= length <= _MAX_HEADER_BYTES and stream.read(1) == b"{"):
        return None
    if length > size - 8:
        raise _unreadable(path, "truncated: its safetensors header is cut short")
    raw = b"{" + stream.read(length - 1)
    try:
        header = json.loads(raw)
    except ValueError as error:  # UnicodeDecodeError included
        raise _unreadable(path, f"corrupt safetensors header: {error}") from error
    return header


def _read_safetensors(path: Path, stream: IO[bytes], header: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    strings = header.get("__metadata__")
    if not isinstance(strings, dict) or strings.get("format") != FILE_FORMAT:
        raise ValueError(
            f"{path} is a safetensors file but not a mirror-map init file (no format tag {FILE_FORMAT!r} in its "
            f"metadata; it holds {sorted(k for k in header if k != '__metadata__')[:5]})"
        )
    _check_version(path, strings.get("layout_version"))
    try:
        tensors = safetensors.torch.load(stream.read())
    except Exception as error:  # SafetensorError for truncated data or bad offsets
        raise _unreadable(path, f"truncated or corrupt safetensors data: {error}") from error
    if VECTOR_KEY not in tensors:
        raise ValueError(f"{path} is not a mirror-map init file: it has no {VECTOR_KEY!r} tensor")
    try:
        metadata = json.loads(strings.get("provenance", "{}"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} has unreadable metadata JSON under 'provenance': {error}") from error
    if not isinstance(metadata, dict):
        raise ValueError(f"{path} has metadata under 'provenance' that is not a JSON object")
    return tensors[VECTOR_KEY], strings.get("param_transform"), metadata


def _read_torch(path: Path, stream: IO[bytes]) -> tuple[Any, Any, dict[str, Any]]:
    """The earlier format. The stream, not the path, goes to torch.load: given a path ending in
    ``.safetensors``, torch.load would hand it to safetensors instead."""
    try:
        content = torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for garbage or truncated files; its first line says enough
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _unreadable(path, f"truncated or corrupt torch file: {reason}") from error
    if not isinstance(content, dict) or content.get("format") != FILE_FORMAT:
        raise ValueError(f"{path} is not a mirror-map init file (missing format tag {FILE_FORMAT!r})")
    _check_version(path, content.get("layout_version"))
    try:
        metadata = json.loads(content.get("metadata_json"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} has unreadable metadata JSON: {error}") from error
    if not isinstance(metadata, dict):
        raise ValueError(f"{path} has metadata that is not a JSON object")
    return content.get("vector"), metadata.get("param_transform"), metadata
