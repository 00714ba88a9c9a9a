"""Finding and reading single-run directories (``python -m inner_loop.run``, incl. Hydra multiruns).

A single-run dir holds ``manifest.json`` (results.store.provenance, written before training) and, once finished,
``result.json``. Every directory found is turned into one row, whatever state it is in, so that a comparison
can say which runs are missing, failed or unreadable instead of silently averaging what is left.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from results.store.atomic import CorruptFileError
from results.store.layout import (CHECKPOINT_DIR, CONFIG_FILE, GENERATION_DIR_PREFIX, LAUNCHER_DIR, RESULT_FILE,
                            RUN_MANIFEST_FILE, parse_member_dir_name)
from results.store.provenance import ES_MEMBER, read_run_manifest
from core.records import ResultRecord

logger = logging.getLogger(__name__)

#: Row states: ok / failed / timeout / cancelled come from result.json; these three are about the files.
MISSING = "missing"  # manifest without result.json: still running, or killed before writing a result
UNREADABLE = "unreadable"  # result.json or manifest.json cannot be parsed
NO_MANIFEST = "no_manifest"  # result.json without provenance: method and task unknown
_SKIP_DIRS = {CHECKPOINT_DIR, ".git", "__pycache__", ".hydra", LAUNCHER_DIR}


@dataclass
class RunRow:
    """One single-run directory as the comparison sees it."""

    path: str
    state: str
    method: str = "unknown"
    #: its manifest says its divergence is the response-length reference (the registry's flag, recorded by the run)
    length_reference: bool = False
    task: str = "unknown"
    seed: int | None = None
    config_hash: str = ""
    code_version: str = ""
    data_hash: str = ""
    fitness: float | None = None
    #: the split ``fitness`` was measured on (validation, or test for a run started with eval_split=test)
    split: str = ""
    mean_response_tokens: float | None = None
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scan:
    rows: list[RunRow]
    #: (path, reason) of directories deliberately left out (ES run roots and members, missing DIR arguments).
    skipped: list[tuple[str, str]]


def _is_es_run_root(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and any(
        p.name.startswith(GENERATION_DIR_PREFIX) for p in path.iterdir() if p.is_dir())


def _in_es_run(path: Path) -> bool:
    """A member dir of a search (a generation's, the selection's or the reporting stage's), whatever its entry point
    wrote in its record: its name is a member's and an ES run root is at most three levels above."""
    return parse_member_dir_name(path.name) is not None and any(_is_es_run_root(p) for p in path.parents[:3])


def find_run_dirs(roots: Iterable[str | Path]) -> Scan:
    """All single-run dirs under ``roots`` (a root may itself be one). ES run dirs are skipped with a reason."""
    found: list[Path] = []
    skipped: list[tuple[str, str]] = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            skipped.append((str(root), "not a directory"))
            continue
        for current, dirs, files in os.walk(root):
            here = Path(current)
            if _is_es_run_root(here):
                skipped.append((str(here), "an ES search run dir (use python -m results.report on it)"))
                dirs[:] = []
                continue
            if RESULT_FILE in files or RUN_MANIFEST_FILE in files:
                found.append(here)
                dirs[:] = []  # inner checkpoints and logs live below; nothing else to find there
                continue
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
    unique = sorted(set(found))
    rows = []
    for path in unique:
        row = read_run_dir(path)
        if row.extra.get("kind") == ES_MEMBER or _in_es_run(path):
            skipped.append((str(path), "an ES population member, not a single run"))
            continue
        rows.append(row)
    return Scan(rows, skipped)


def _first_data_hash(manifest: dict[str, Any]) -> str:
    hashes = manifest.get("data_hashes") or {}
    if not isinstance(hashes, dict):
        return ""
    return ",".join(f"{k}:{v}" for k, v in sorted(hashes.items()))


def _scored_split(manifest: dict[str, Any]) -> str:
    """The split a run is scored on, from the splits its manifest hashed (train + the scored one), so a run
    without a result yet is still grouped with its split."""
    hashes = manifest.get("data_hashes") or {}
    scored = sorted(k for k in hashes if k != "train") if isinstance(hashes, dict) else []
    return scored[0] if len(scored) == 1 else ""


def read_run_dir(path: str | Path) -> RunRow:
    """The row of one run dir; never raises for a bad file (the row's state says what is wrong)."""
    path = Path(path)
    row = RunRow(path=str(path), state=MISSING)
    try:
        manifest = read_run_manifest(path)
    except CorruptFileError as exc:
        row.state, row.error = UNREADABLE, str(exc)
        return row
    if manifest is not None:
        row.method = str(manifest.get("method", "unknown"))
        row.length_reference = bool(manifest.get("length_reference", False))
        row.task = str(manifest.get("task", "unknown"))
        seed = manifest.get("seed")
        row.seed = int(seed) if isinstance(seed, int) else None
        row.config_hash = str(manifest.get("config_hash", ""))
        row.code_version = str(manifest.get("code_version", ""))
        row.data_hash = _first_data_hash(manifest)
        row.split = _scored_split(manifest)
        row.extra["kind"] = manifest.get("kind")
    result_path = path / RESULT_FILE
    if not result_path.exists():
        row.state = MISSING if manifest is not None else NO_MANIFEST
        row.error = "no result.json (still running, or killed before it finished)"
        return row
    try:
        record = ResultRecord.from_dict(json.loads(result_path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
        row.state, row.error = UNREADABLE, f"{result_path}: {exc}"
        return row
    if manifest is None:
        row.state = NO_MANIFEST
        row.error = "result.json without manifest.json: method, task and seed unknown (run predates provenance?)"
        return row
    row.state = record.status
    row.split = record.eval_split
    row.error = record.error.strip().splitlines()[-1][:200] if record.error.strip() else ""
    if record.ok:
        row.fitness = record.fitness
        row.mean_response_tokens = record.mean_response_tokens
    return row
