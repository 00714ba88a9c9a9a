"""Mirror-map init files: the 380-long search vector plus JSON metadata, in one torch file.

The file is a dict {"format", "layout_version", "vector", "metadata_json"} readable with
torch.load(weights_only=True), so loading never runs pickled code. It is written to a temporary file in
the same directory, fsynced and moved into place, so a crash never leaves half a file under the name.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from mirror_maps.neural import PARAM_TRANSFORMS, VECTOR_LENGTH, NeuralMirrorMap

FILE_FORMAT = "mirror-es/neural-mirror-init"
LAYOUT_VERSION = 1
"""Version 1: [v(126), w(126), b(126), a, c]; blocks u^3, u^2, sqrt, cbrt, log(u+ + 1e-3), exp."""


def _atomic_write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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

    The stored metadata adds layout_version and param_transform; `metadata` must be JSON-serialisable and
    may not override those two keys.
    """
    path = Path(path)
    user_metadata = dict(metadata or {})
    for reserved in ("layout_version", "param_transform"):
        if reserved in user_metadata:
            raise ValueError(f"metadata key {reserved!r} is written by save_init itself; remove it")
    full_metadata = {"layout_version": LAYOUT_VERSION, "param_transform": mirror_map.param_transform, **user_metadata}
    try:
        metadata_json = json.dumps(full_metadata, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata for {path} is not JSON-serialisable: {error}") from error
    vector = mirror_map.to_vector()
    if not torch.isfinite(vector).all():
        raise ValueError(f"refusing to write {path}: the mirror-map vector contains NaN or inf")
    buffer = io.BytesIO()
    torch.save(
        {
            "format": FILE_FORMAT,
            "layout_version": LAYOUT_VERSION,
            "vector": vector.to(torch.float64).cpu(),
            "metadata_json": metadata_json,
        },
        buffer,
    )
    _atomic_write(path, buffer.getvalue())
    return path


def load_init(path: str | os.PathLike) -> tuple[NeuralMirrorMap, dict[str, Any]]:
    """Read an init file written by save_init -> (map with the stored transform, metadata dict).

    Raises FileNotFoundError for a missing file and ValueError naming the file for anything else wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mirror-map init file {path} does not exist")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for garbage or truncated files
        raise ValueError(f"{path} is not a readable mirror-map init file (truncated or not a torch file): {error}") from error
    if not isinstance(content, dict) or content.get("format") != FILE_FORMAT:
        raise ValueError(f"{path} is not a mirror-map init file (missing format tag {FILE_FORMAT!r})")
    version = content.get("layout_version")
    if version != LAYOUT_VERSION:
        raise ValueError(f"{path} has layout_version {version!r}; this code reads only version {LAYOUT_VERSION}")
    vector = content.get("vector")
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or vector.numel() != VECTOR_LENGTH:
        shape = list(vector.shape) if isinstance(vector, torch.Tensor) else type(vector).__name__
        raise ValueError(f"{path} holds a vector of shape {shape}; a mirror-map vector has {VECTOR_LENGTH} numbers")
    if not vector.is_floating_point() or not torch.isfinite(vector).all():
        raise ValueError(f"{path} holds a vector with NaN/inf or a non-float dtype")
    try:
        metadata = json.loads(content.get("metadata_json"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} has unreadable metadata JSON: {error}") from error
    if not isinstance(metadata, dict):
        raise ValueError(f"{path} has metadata that is not a JSON object")
    transform = metadata.get("param_transform")
    if transform not in PARAM_TRANSFORMS:
        raise ValueError(f"{path} has param_transform {transform!r}; expected one of {PARAM_TRANSFORMS}")
    return NeuralMirrorMap.from_vector(vector, param_transform=transform), metadata

