"""es=nres: one member's piece of its particle's training run, and the particle's checkpoints at truncation boundaries.

A particle (meta/searchers/nres.py) is one training run of ``horizon`` steps cut into truncations. Each generation
one member runs the particle's next truncation: from its checkpoint at ``start`` to ``stop``, with the map the
generation gives it (fixed over the truncation), the learning-rate schedule still defined over ``horizon``, and it
reports the change of validation pass@1 over the truncation. The boundary checkpoints live in the particle's folder
(not in the member's work dir, which belongs to one generation: a requeue in mid-truncation resumes from the
member's own checkpoints there, as any member's does). This module is the contract both kinds of member (the
training run and the synthetic objective) follow, and the orchestrator's housekeeping of the particles' folders.
Standard library only: member processes import it.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from core.records import MemberSpec, Segment
from results.store.atomic import atomic_write_json, fsync_dir, fsync_tree
from results.store.layout import BOUNDARY_FILE, boundary_dir_name, parse_boundary_dir_name

#: the diagnostics a truncation's record carries (members table: diag_<name>)
START_SCORE, END_SCORE, START_STEP, STOP_STEP = ("truncation_start_score", "truncation_end_score",
                                                 "truncation_start", "truncation_stop")
#: the keys of a generation's stored state (results/store/run_store.py write_state) that say what each job trained
#: in it and what each will train in the next generation: per job, ``work_entry``'s dict
SEGMENTS_KEY, NEXT_SEGMENTS_KEY = "segments", "next_segments"
_TEMP_PREFIX = ".writing-"
_TRASH_PREFIX = ".deleting-"


@dataclass(frozen=True)
class Truncation:
    """Which piece of which run a member trains: steps [start, stop) of run ``episode`` of ``particle``."""

    particle: int
    episode: int
    start: int
    stop: int
    horizon: int
    particle_dir: str

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop <= self.horizon:
            raise ValueError(f"truncation steps must satisfy 0 <= start < stop <= horizon, got start={self.start} "
                             f"stop={self.stop} horizon={self.horizon}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Truncation":
        return cls(particle=int(data["particle"]), episode=int(data["episode"]), start=int(data["start"]),
                   stop=int(data["stop"]), horizon=int(data["horizon"]), particle_dir=str(data["particle_dir"]))

    @classmethod
    def of(cls, run: Mapping[str, Any], segment: Segment) -> "Truncation":
        """The truncation a member trains: the particle run it continues (a spec's ``truncation``: particle,
        episode, particle_dir) and its steps (the spec's segment)."""
        return cls(particle=int(run["particle"]), episode=int(run["episode"]), start=segment.start,
                   stop=segment.stop, horizon=segment.horizon, particle_dir=str(run["particle_dir"]))

    @classmethod
    def of_spec(cls, spec: MemberSpec) -> "Truncation | None":
        """The truncation ``spec`` trains; None for a member that trains a run of its own."""
        return None if spec.truncation is None else cls.of(spec.truncation, spec.work)

    @property
    def resume_from(self) -> str | None:
        """The particle's boundary checkpoint this truncation starts from (None at step 0: the untouched model)."""
        return str(self.boundary(self.start)) if self.start else None

    def boundary(self, step: int) -> Path:
        """The folder of this particle's checkpoint at ``step`` of this run."""
        return Path(self.particle_dir) / boundary_dir_name(self.episode, step)


def work_entry(segment: Segment, run: Mapping[str, Any] | None) -> dict[str, Any]:
    """One job's work as a generation's state keeps it: its segment, and the particle run it continues (particle,
    episode; None: a run of its own)."""
    return {**segment.to_dict(), "run": None if run is None else {"particle": int(run["particle"]),
                                                                   "episode": int(run["episode"])}}


def read_boundary(folder: str | Path) -> dict[str, Any] | None:
    """A boundary's record {episode, step, score, generation}; None when the folder is absent or incomplete (its
    record is written last)."""
    try:
        data = json.loads((Path(folder) / BOUNDARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "score" in data else None


def publish_boundary(truncation: Truncation, score: float, generation: int, fill: Callable[[Path], None],
                     extra: Mapping[str, Any] | None = None) -> Path:
    """Write the checkpoint at ``truncation.stop``: ``fill(folder)`` writes its files into a fresh folder, the record
    goes in last, then the folder is renamed into place. A boundary left by an earlier run of the same truncation (a
    pair re-run after a straggler) is replaced; a kill at any point leaves either the old one or the new one."""
    target = truncation.boundary(truncation.stop)
    temp = target.parent / f"{_TEMP_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}"
    temp.mkdir(parents=True)
    fill(temp)
    fsync_tree(temp)  # the checkpoint's files on disk before its record says it is complete
    atomic_write_json(temp / BOUNDARY_FILE, {**dict(extra or {}), "episode": truncation.episode,
                                             "step": truncation.stop, "score": float(score),
                                             "generation": int(generation)})
    if target.exists():
        _discard(target)
    os.replace(temp, target)
    fsync_dir(target.parent)
    return target


def prune_boundaries(particle_dir: str | Path, keep: Callable[[int, int, Mapping[str, Any] | None], bool]) -> int:
    """Delete the particle's boundary folders for which ``keep(episode, step, record)`` is false, and leftovers of
    interrupted writes; returns how many went. Each goes through a rename first, so a kill mid-delete never leaves a
    half-deleted folder under a boundary's name."""
    root = Path(particle_dir)
    if not root.is_dir():
        return 0
    removed = 0
    for entry in sorted(root.iterdir()):
        parsed = parse_boundary_dir_name(entry.name)
        stale = entry.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX))
        if parsed is not None and not keep(parsed[0], parsed[1], read_boundary(entry)):
            stale = True
        if stale and entry.is_dir():
            _discard(entry)
            removed += 1
    return removed


def boundary_bytes(particle_dirs: Iterable[str | Path]) -> int:
    """Bytes the particles' boundary checkpoints hold now (meta.status's disk line)."""
    total = 0
    for folder in particle_dirs:
        for path in Path(folder).rglob("*"):
            try:
                total += path.stat().st_size if path.is_file() else 0
            except FileNotFoundError:
                continue
    return total


def _discard(folder: Path) -> None:
    trash = folder.parent / f"{_TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}"
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)
