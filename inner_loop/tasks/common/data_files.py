"""Rows of a hub dataset split or of a local JSON / JSONL / parquet file in the hub's format.

Hub loading goes through ``datasets.load_dataset`` (the real path users have on a cluster with a warm cache);
local files are read directly so that a malformed file is reported with its path and row number instead of
an Arrow traceback.
"""
from __future__ import annotations

import functools
import json
import logging
import socket
import urllib.parse
from pathlib import Path
from typing import Any, Iterable, Sequence

logger = logging.getLogger(__name__)

LOCAL_FORMATS = (".json", ".jsonl", ".parquet")


def read_local_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local file: ``.jsonl`` (one object per line), ``.json`` (an array of objects, or JSON lines,
    as the hub's JSON loader accepts both) or ``.parquet``."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"data file {str(file)!r} does not exist; fix the path in the task config")
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(file).to_pylist()
        except Exception as exc:  # pyarrow raises several unrelated types for a bad file
            raise ValueError(f"data file {str(file)!r} is not a readable parquet file: {exc}") from exc
    elif suffix in (".json", ".jsonl"):
        rows = _read_json_rows(file)
    else:
        raise ValueError(f"data file {str(file)!r}: unsupported format {suffix!r}; use one of {LOCAL_FORMATS}")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise ValueError(f"data file {str(file)!r}, row {number}: expected a JSON object, got {row!r:.80}")
    return rows


def _read_json_rows(file: Path) -> list[Any]:
    text = file.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if file.suffix.lower() == ".json" and stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"data file {str(file)!r} is not valid JSON: {exc}") from exc
        return list(data)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"data file {str(file)!r}, line {number}: not valid JSON ({exc.msg})") from exc
    return rows


#: seconds the one connection attempt to the hub may take before the hub counts as unreachable
HUB_PROBE_TIMEOUT_S = 3.0


def load_hub_rows(hub_id: str, hub_config: str | None, split: str,
                  file_keys: Sequence[str] = ("train_file", "test_file")) -> list[dict[str, Any]]:
    """Rows of one split of a hub dataset (uses the local ``datasets`` cache when offline). ``file_keys``: the
    task's settings that replace the hub with local files, named in the error when the split cannot be had."""
    import datasets

    offline = _offline_unless_reachable()
    logger.info("loading %s (%s) split %s from %s", hub_id, hub_config, split,
                "the local cache only (offline)" if offline else "the hub or its cache")
    try:
        dataset = datasets.load_dataset(hub_id, hub_config, split=split)
    except Exception as exc:  # network, missing cache, unknown config: all mean "data not reachable"
        files = ", ".join(f"task.{key}=<file>" for key in file_keys)
        raise ValueError(
            f"could not load hub dataset {hub_id!r} (config {hub_config!r}, split {split!r}): {exc}. "
            f"Without the hub, give local files in the hub's format (JSON, JSONL or parquet): {files}"
        ) from exc
    return [dict(row) for row in dataset]


@functools.cache
def _offline_unless_reachable() -> bool:
    """Whether hub loading runs offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set, or the hub's endpoint refused
    one connection (HUB_PROBE_TIMEOUT_S, once per process). Then ``datasets`` reads its cache alone instead of
    retrying every file for half a minute, and a missing split fails at once."""
    import datasets
    import huggingface_hub.constants as hub_constants

    if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
        return True
    endpoint = urllib.parse.urlsplit(hub_constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S).close()
        return False
    except OSError as exc:
        logger.warning("the hub (%s) cannot be reached (%s): reading its local cache only, without retries",
                       hub_constants.ENDPOINT, exc)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    hub_constants.HF_HUB_OFFLINE = True
    return True


def require_fields(rows: Iterable[dict[str, Any]], fields: dict[str, type | tuple[type, ...]], where: str) -> None:
    """Every row has every field with the expected type; errors name the source and the 1-based row."""
    for number, row in enumerate(rows, start=1):
        for name, expected in fields.items():
            if name not in row or row[name] is None:
                raise ValueError(f"{where}, row {number}: missing field {name!r} (has {sorted(row)})")
            if not isinstance(row[name], expected):
                raise ValueError(
                    f"{where}, row {number}: field {name!r} should be {expected}, got {type(row[name]).__name__}"
                )
