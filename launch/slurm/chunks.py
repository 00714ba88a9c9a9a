"""Recoverable SLURM submission: a searchable name per array chunk, and a marker written before its sbatch.

A generation is submitted as several arrays (chunks of at most MaxArraySize). The orchestrator can die, or
sbatch can fail, between two chunks or between an sbatch and the moment its job ids are recorded. So that a
resume can find what was submitted instead of submitting it twice, each chunk
- is named ``<launcher.job_name>.<run id>.g<generation>.c<chunk>`` (``squeue -n`` finds it; parseable from
  the right, so the user's prefix may contain dots), and
- has a marker ``<launcher folder>/submissions/chunk_<chunk>.json`` written BEFORE its sbatch: the name and
  the member order (array task k runs ``members[k]``: index, attempt, submission number; a packed array names each
  member's task in ``tasks``), plus the array's
  job id once sbatch answered. A marker without a job id means "maybe submitted": ask squeue by name.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from results.store.atomic import CorruptFileError, atomic_write_json
from results.store.layout import SUBMISSIONS_DIR as MARKER_DIR  # re-exported under its old name
from results.store.layout import chunk_marker_name, parse_chunk_marker_name

_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<run>[A-Za-z0-9_-]+)\.g(?P<generation>\d+)\.c(?P<chunk>\d+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


#: accounting keeps 255 characters of a job name: with launcher.job_name capped (slurm_options.py) and the
#: run id capped here, a name stays whole in sacct, so ``sacct --name`` finds it too
RUN_ID_MAX = 64


def chunk_job_name(prefix: str, run_id: str, generation: int, chunk: int) -> str:
    """The SLURM job name of one array chunk (run id reduced to ``[A-Za-z0-9_-]`` so the name parses)."""
    run = _UNSAFE.sub("-", run_id)[:RUN_ID_MAX] or "run"
    return f"{prefix}.{run}.g{generation:04d}.c{chunk:03d}"


def parse_chunk_job_name(name: str) -> tuple[str, str, int, int] | None:
    """``(prefix, run id, generation, chunk)`` of a name made by chunk_job_name, else None."""
    match = _NAME.match(name)
    if match is None:
        return None
    return match["prefix"], match["run"], int(match["generation"]), int(match["chunk"])


@dataclass
class ChunkMarker:
    """What one chunk's sbatch was (or is about to be): see the module docstring."""

    chunk: int
    name: str
    members: list[tuple[int, int, int]] = field(default_factory=list)  # (index, attempt, submission) per member
    job_id: str | None = None
    #: the array task of each entry of ``members`` (packed tasks run several members); None: entry k is task k
    tasks: list[int] | None = None

    def task_of(self, position: int) -> int:
        """The array task that runs ``members[position]``."""
        return position if self.tasks is None else self.tasks[position]

    def to_dict(self) -> dict:
        data = {"chunk": self.chunk, "name": self.name, "job_id": self.job_id,
                "members": [list(m) for m in self.members]}
        if self.tasks is not None:
            data["tasks"] = list(self.tasks)
        return data

    @classmethod
    def from_dict(cls, data: dict, path: Path) -> "ChunkMarker":
        try:
            members = [(int(i), int(a), int(s)) for i, a, s in data["members"]]
            job_id = data["job_id"]
            tasks = data.get("tasks")
            marker = cls(chunk=int(data["chunk"]), name=str(data["name"]), members=members,
                         job_id=None if job_id is None else str(job_id),
                         tasks=None if tasks is None else [int(t) for t in tasks])
            if marker.tasks is not None and len(marker.tasks) != len(members):
                raise ValueError(f"{len(marker.tasks)} tasks for {len(members)} members")
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(_corrupt(path, f"unexpected content ({exc!r})")) from exc
        return marker


def marker_path(folder: Path, chunk: int) -> Path:
    return folder / MARKER_DIR / chunk_marker_name(chunk)


def write_marker(folder: Path, marker: ChunkMarker) -> None:
    """Atomic (temp file, fsync, rename): a crash leaves the old marker or the new one."""
    atomic_write_json(marker_path(folder, marker.chunk), marker.to_dict())


def read_markers(folder: Path) -> list[ChunkMarker]:
    """Every chunk marker of a launcher folder, oldest chunk first; CorruptFileError naming a bad one."""
    directory = folder / MARKER_DIR
    if not directory.is_dir():
        return []
    markers = []
    for path in directory.iterdir():
        if parse_chunk_marker_name(path.name) is None:
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CorruptFileError(_corrupt(path, f"not valid JSON ({exc})")) from exc
        if not isinstance(data, dict):
            raise CorruptFileError(_corrupt(path, "not a JSON object"))
        markers.append(ChunkMarker.from_dict(data, path))
    return sorted(markers, key=lambda m: m.chunk)


def next_chunk_number(folder: Path) -> int:
    """Chunk numbers never repeat within a launcher folder (one per generation), across resumes too."""
    directory = folder / MARKER_DIR
    if not directory.is_dir():
        return 0
    numbers = [n for n in map(parse_chunk_marker_name, (p.name for p in directory.iterdir())) if n is not None]
    return max(numbers, default=-1) + 1


def _corrupt(path: Path, what: str) -> str:
    return (f"submission marker {path}: {what}. It maps array tasks to members; if no job of this chunk is "
            f"queued (squeue -n <its name>) delete the file and resume, and the chunk's members are submitted again")
