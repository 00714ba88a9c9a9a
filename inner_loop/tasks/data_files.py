"""Rows of a hub dataset split or of a local JSON / JSONL / parquet file in the hub's format.

Hub loading goes through ``datasets.load_dataset`` (the real path users have on a cluster with a warm cache);
local files are read directly so that a malformed file is reported with its path and row number instead of
an Arrow traceback.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

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


def load_hub_rows(hub_id: str, hub_config: str | None, split: str) -> list[dict[str, Any]]:
    """Rows of one split of a hub dataset (uses the local ``datasets`` cache when offline)."""
    import datasets

    logger.info("loading %s (%s) split %s from the hub or its cache", hub_id, hub_config, split)
    try:
        dataset = datasets.load_dataset(hub_id, hub_config, split=split)
    except Exception as exc:  # network, missing cache, unknown config: all mean "data not reachable"
        raise ValueError(
            f"could not load hub dataset {hub_id!r} (config {hub_config!r}, split {split!r}): {exc}. "
            "Without network access, point the task's train_file / test_file at local files in the same format"
        ) from exc
    return [dict(row) for row in dataset]


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
