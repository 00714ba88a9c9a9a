"""What a training run needs from the Hugging Face hub (its model, its task's dataset), staged once into a cache on
the shared filesystem and read from there, offline, by every member.

Why: a search starts ~180 members at once; each loading its model and data by hub name is 180 downloads (or 180
failures on compute nodes without internet, each retried for ~20 s), and the hub's "main" may move between two
members. Staging resolves each hub reference of the inner config to one commit, downloads that snapshot into the
stage cache (an ordinary hub cache: ``huggingface_hub.snapshot_download(cache_dir=...)``), and hands back the
snapshot's local directory, which replaces the hub name in the members' config: transformers, vLLM and
``datasets.load_dataset`` then all read the same local files. The pin (commit, content hash, bytes) goes into the
run's manifest (meta/search/staging.py); later checks compare against it. The transfer tasks a run scores afterwards
(``extra_evaluations``) are staged with it: a reporting member reads their datasets from the same cache, offline.

This module knows which inner-config keys name hub repositories; the outer loop only rewrites the keys it is given.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from inner_loop.config import ModelConfig, node_config
from inner_loop.models.cache import cache_root
from results.store.atomic import atomic_write_json
from core.stage_pins import LOCAL, MISSING, STAGED, StagePin

#: the files of a model snapshot a run reads: weights (safetensors), configs, tokenizer and chat template
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken")
#: the config key of the evaluations a run scores after its fitness (transfer tasks among them)
EXTRA_KEY = "extra_evaluations"
#: where content hashes of staged snapshots are kept, inside the stage cache (hashing weights once, not per check)
_HASHES_DIR = ".content-hashes"


def default_cache_dir() -> Path:
    """The stage cache when the config names none: beside the built models ($MIRROR_ES_CACHE/hub)."""
    return cache_root() / "hub"


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def _task_hub_id(task: Mapping[str, Any]) -> str | None:
    """The hub dataset a task node loads by name (its task class declares it: Task.staged_dataset), or None (local
    files, local data, or a task without a hub)."""
    from inner_loop.tasks import build_task

    hub_id = build_task(task).staged_dataset()
    return hub_id if isinstance(hub_id, str) and not _is_local(hub_id) else None


def _extra_tasks(inner: Mapping[str, Any]) -> list[tuple[int, str, Mapping[str, Any]]]:
    """(index, name, task node) of each extra evaluation with a task of its own (not the run's own test split)."""
    return [(index, str(extra.get("name")), extra["task"])
            for index, extra in enumerate(inner.get(EXTRA_KEY) or [])
            if isinstance(extra, Mapping) and isinstance(extra.get("task"), Mapping)]


def hub_references(inner: Mapping[str, Any]) -> list[StagePin]:
    """The hub repositories an inner config loads by name (none for the tiny model, local paths or local data): its
    model, its task's dataset and the datasets of its extra evaluations' tasks (transfer tasks)."""
    from inner_loop.models.registry import model_entry

    items = []
    model = node_config(ModelConfig, "model", inner.get("model"))
    entry = model_entry(model.name)
    repo = model.name_or_path or (entry.hub_id if entry is not None else None)  # a built model fetches nothing
    if repo and not _is_local(repo):
        items.append(StagePin("model", repo, "model.name_or_path"))
    hub_id = _task_hub_id(inner["task"])
    if hub_id:
        items.append(StagePin("dataset", hub_id, "task.hub_id"))
    for index, name, task in _extra_tasks(inner):
        hub_id = _task_hub_id(task)
        if hub_id:
            items.append(StagePin("dataset", hub_id, f"{EXTRA_KEY}.{index}.task.hub_id", used_by=name))
    return items


def local_evaluations(inner: Mapping[str, Any]) -> list[StagePin]:
    """The extra evaluations whose task reads nothing from the hub (HumanEval's package, local files): nothing to
    stage, but a dry run's list names them, so a transfer task missing from it is never taken for a local one."""
    return [StagePin("task", name, f"{EXTRA_KEY}.{index}.task", status=LOCAL,
                      detail="needs nothing from the hub (its data is a local file or ships with a package)")
            for index, name, task in _extra_tasks(inner) if _task_hub_id(task) is None]


def use_staged(inner: Mapping[str, Any], pins: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``inner`` with each hub name that ``pins`` (a staging's items) holds staged replaced by its snapshot's local
    path: how a config composed after staging (a reporting row's transfer task, a tuning trial) reads the pinned
    copies. Names without a staged pin are left as they are."""
    staged = {(p.get("kind"), p.get("repo_id")): p.get("path") for p in pins if p.get("status") == STAGED}
    out = copy.deepcopy(dict(inner))
    for item in hub_references(out):
        path = staged.get((item.kind, item.repo_id))
        if path:
            node: Any = out
            *parents, last = item.key.split(".")
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[last] = path
    return out


def content_hash(folder: Path) -> tuple[str, int]:
    """(sha256, bytes) over a snapshot's files, names included, in a fixed order; symlinks (the hub cache's blobs)
    are followed."""
    digest, total = hashlib.sha256(), 0
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                total += len(block)
    return digest.hexdigest(), total


def snapshot_bytes(folder: Path) -> int:
    """Total size of a snapshot's files (a cheap check against the pin, where hashing would read every byte)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _hash_of(cache_dir: Path, item: StagePin, snapshot: Path) -> tuple[str, int]:
    """The snapshot's content hash, computed once per snapshot and kept in the stage cache."""
    record = cache_dir / _HASHES_DIR / f"{item.kind}--{item.repo_id.replace('/', '--')}--{snapshot.name}.json"
    if record.is_file():
        known = json.loads(record.read_text())
        if known.get("bytes") == snapshot_bytes(snapshot):
            return known["sha256"], known["bytes"]
    sha256, total = content_hash(snapshot)
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(record, {"sha256": sha256, "bytes": total})
    return sha256, total


def _snapshot(item: StagePin, revision: str, cache_dir: Path, fetch: bool,
              model_patterns: Sequence[str] | None) -> Path:
    from huggingface_hub import snapshot_download

    patterns = list(model_patterns or MODEL_PATTERNS) if item.kind == "model" else None
    return Path(snapshot_download(item.repo_id, repo_type=item.kind, revision=revision, cache_dir=str(cache_dir),
                                  allow_patterns=patterns, local_files_only=not fetch))


def stage_inner(inner: Mapping[str, Any], cache_dir: str | Path | None = None,
                revisions: Mapping[str, str] | None = None, pins: Iterable[Mapping[str, Any]] = (),
                fetch: bool = False, model_patterns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Each hub repository ``inner`` names, found in (``fetch``: first downloaded into) the stage cache.

    ``pins``: the items of an earlier staging (a run's manifest); a pinned repository is looked up at its pinned
    commit and must still hold the same bytes, so a resumed run never reads another revision. ``revisions``: the
    revision per repo id to stage when nothing is pinned yet (default ``main``). Returns the items as dicts
    (``StagePin`` fields, with ``line`` and ``offline``: this host can fetch nothing, as it was told (HF_HUB_OFFLINE)
    or finds by one connection to the hub before fetching, or in a dry run when something is missing), staged or
    missing with the reason; nothing here raises for a missing repository.
    """
    import httpx
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    pinned = {(p.get("kind"), p.get("repo_id")): p for p in pins}
    references = hub_references(inner)
    # A host without network is found out once, here, not by huggingface_hub's retries per file (a minute or more)
    offline = bool(references) and fetch and (offline_requested() or not hub_reachable())
    fetch = fetch and not offline
    out = []
    for item in references:
        pin = pinned.get((item.kind, item.repo_id))
        revision = (pin or {}).get("revision") or (revisions or {}).get(item.repo_id) or "main"
        try:
            snapshot = _snapshot(item, revision, cache, fetch, model_patterns)
        except LocalEntryNotFoundError:
            item.detail = f"not in the stage cache {cache} at revision {revision}"
        except (OSError, ValueError, httpx.HTTPError) as exc:  # network, unknown repo or revision, access
            item.detail = f"could not stage revision {revision} into {cache}: {str(exc).splitlines()[0][:300]}"
        else:
            item.revision, item.path = snapshot.name, str(snapshot)
            item.sha256, item.bytes = _hash_of(cache, item, snapshot)
            item.status = STAGED
            if pin and (pin.get("sha256"), pin.get("bytes")) != (item.sha256, item.bytes):
                item.status = MISSING
                item.detail = (f"the snapshot {snapshot} no longer holds the pinned content (sha256 "
                               f"{pin.get('sha256')}, {pin.get('bytes')} bytes; found {item.sha256}, "
                               f"{item.bytes} bytes)")
        out.append(item)
    if not offline and not fetch and any(i.status == MISSING for i in out):  # a dry run: could this host fetch it?
        offline = offline_requested() or not hub_reachable()
    for item in out:
        if offline and item.status == MISSING:
            item.detail += "; this host is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or no connection to the hub)"
    return [item.as_dict(offline) for item in [*out, *local_evaluations(inner)]]


def is_offline_ready(inner: Mapping[str, Any]) -> bool:
    """Whether a run of ``inner`` reads nothing from the hub (every model and dataset is a local path or built here)."""
    return not hub_references(inner)


def offline_requested() -> bool:
    """Whether this process was told to stay off the network (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    from huggingface_hub import constants

    said = [os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")
            for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")]
    return bool(constants.HF_HUB_OFFLINE) or any(said)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout_s`` (one try: a node without network
    answers at once or not at all, where huggingface_hub and datasets would retry for a minute)."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname or "", endpoint.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True
