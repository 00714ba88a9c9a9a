"""Provenance of a run: which code, which config and which data produced a number.

A comparison table is only trustworthy if every row says where it came from. A single training run (and every
ES member trained by ``inner_loop.member.lifecycle.train_in_process``) writes ``<work_dir>/manifest.json`` through
``write_run_manifest`` before training starts; ``results.report.compare`` and ``results.report.search.report`` read it back with
``read_run_manifest``.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping

from results.store.atomic import CorruptFileError, atomic_write_json, sha256_file
from core.config.plain_data import plain
from results.store.layout import (RUN_MANIFEST_FILE)  # re-exported: importers use results.store.provenance.RUN_MANIFEST_FILE

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
#: ``kind`` of a manifest written for ``python -m inner_loop.run`` (spec.run_id == "single").
SINGLE_RUN = "single_run"
#: ``kind`` of a manifest written inside an ES member's work dir.
ES_MEMBER = "es_member"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def config_hash(config: Mapping[str, Any]) -> str:
    """Order-independent hash (16 hex digits) of a JSON-like config; equal configs hash equal across runs."""
    canonical = json.dumps(plain(config), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def code_version(repo_dir: str | Path | None = None) -> str:
    """``<commit>``, ``<commit>-dirty`` when tracked files differ from it, or ``unknown`` outside a git checkout.

    The dirty flag matters: a result from uncommitted code cannot be reproduced from the commit alone.
    """
    cwd = Path(repo_dir) if repo_dir is not None else _REPO_ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=20,
                              check=False)
        commit = head.stdout.strip()
        if head.returncode != 0 or not commit:
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if status.returncode != 0:
        return f"{commit}-unknown-state"
    return f"{commit}-dirty" if status.stdout.strip() else commit


def prompt_hash(prompt: str) -> str:
    """Hash of a prompt after whitespace normalisation. The split-disjointness check (inner_loop.tasks) and the
    data hashes of a manifest both use it, so "same data" means the same thing in both; it lives here because
    results/ must not import inner_loop."""
    return hashlib.sha256(" ".join(prompt.split()).encode("utf-8")).hexdigest()


def split_hash(prompts: Iterable[str]) -> str:
    """Hash (16 hex digits) of one data split: its prompts' whitespace-normalised hashes, in split order.

    Uses the same per-prompt hash as the split-disjointness check, so "same data" means the same thing in both.
    Order is kept because it decides which prompts a short run trains on.
    """
    digest = hashlib.sha256()
    count = 0
    for prompt in prompts:
        digest.update(prompt_hash(prompt).encode("ascii"))
        count += 1
    digest.update(f"n={count}".encode("ascii"))
    return digest.hexdigest()[:16]


def data_hashes(splits: Mapping[str, Iterable[Any]]) -> dict[str, str]:
    """``{split: split_hash}`` for problems (objects with ``.prompt``) or plain prompt strings."""
    return {name: split_hash(p if isinstance(p, str) else p.prompt for p in problems)
            for name, problems in splits.items()}


def _init_file_hash(inner: Mapping[str, Any]) -> str | None:
    """sha256 of a mirror-map init file named by ``divergence.init``: the path alone does not say what was in it."""
    divergence = inner.get("divergence")
    init = divergence.get("init") if isinstance(divergence, Mapping) else None
    if isinstance(init, str) and init and Path(init).is_file():
        return sha256_file(init)
    return None


def build_run_manifest(
    *,
    run_id: str,
    seed: int,
    inner: Mapping[str, Any],
    splits: Mapping[str, Iterable[Any]],
    params: Iterable[float] = (),
    numerics: Mapping[str, Any] | None = None,
    length_reference: bool = False,
) -> dict[str, Any]:
    """The manifest of one training run (``numerics``: the CPU settings it computed with, as the member reports
    them; ``length_reference``: its divergence is the one response lengths are compared with, as the divergence
    registry declares, which results.compare cannot import). ``config_hash`` covers the inner config, the mirror-map parameters and
    the init file's content, but not the seed, so the seeds of one method share a hash."""
    inner = plain(inner)
    params = [float(x) for x in params]
    init_sha = _init_file_hash(inner)
    hashed: dict[str, Any] = {"inner": inner}
    if params:
        hashed["params"] = params
    if init_sha:
        hashed["init_file_sha256"] = init_sha
    divergence = inner.get("divergence") if isinstance(inner.get("divergence"), Mapping) else {}
    task = inner.get("task") if isinstance(inner.get("task"), Mapping) else {}
    return {
        "format": MANIFEST_FORMAT,
        "kind": SINGLE_RUN if run_id == "single" else ES_MEMBER,
        "run_id": run_id,
        "method": str(divergence.get("name", "unknown")),
        "length_reference": bool(length_reference),
        "divergence_form": divergence.get("form"),
        "task": str(task.get("name", "unknown")),
        "model": _model_name(inner.get("model")),
        "seed": int(seed),
        "config_hash": config_hash(hashed),
        "code_version": code_version(),
        "data_hashes": data_hashes(splits),
        "init_file_sha256": init_sha,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "numerics": dict(numerics) if numerics else None,
        "config": inner,
    }


def _model_name(model: Any) -> str | None:
    if not isinstance(model, Mapping):
        return None
    return model.get("name_or_path") or model.get("name")


def write_run_manifest(work_dir: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Atomically write ``<work_dir>/manifest.json``."""
    return atomic_write_json(Path(work_dir) / RUN_MANIFEST_FILE, dict(manifest))


def read_run_manifest(work_dir: str | Path) -> dict[str, Any] | None:
    """The manifest of a run dir; None if absent; CorruptFileError if present but unreadable."""
    path = Path(work_dir) / RUN_MANIFEST_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptFileError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
