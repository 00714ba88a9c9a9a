"""The files a member writes in its work dir while it runs and when it ends: one reader and writer each.

- ``progress.json``: its training progress, rewritten at each logging step. Advisory, for people and the
  orchestrator's warnings (meta.status, the live view): a missing or unreadable file means "no progress known", never
  a failure.
- ``intermediate.jsonl``: the intermediate validation scores of a member trained with ``train.eval_every``, one line
  each, which a tuner reads to report to its pruner. Append-only JSON lines, flushed and fsynced per line: a crash
  mid-write leaves at most a torn line, which the reader skips and the next append does not join; a member resumed
  from a checkpoint may score a step again, and the reader keeps the latest line per step (the run that continued).
- ``result.json``: its result record (core/records.py), written once.

Standard library only: member processes import it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.records import ResultRecord
from results.store.atomic import atomic_create_bytes, atomic_write_json, json_bytes
from results.store.layout import INTERMEDIATE_FILE, PROGRESS_FILE, RESULT_FILE

#: how many of the latest logged values the file keeps for the per-step series (a warning needs a streak)
RECENT = 5


@dataclass
class MemberProgress:
    step: int
    max_steps: int
    started_at: float  # wall clock of this run's first logged step (a requeued run starts again)
    updated_at: float
    seconds_per_step: float | None = None
    reward_mean: float | None = None
    zero_std_fraction: float | None = None  # TRL's frac_reward_zero_std: groups whose rewards are all equal
    regularizer_grad_share: float | None = None
    zero_std_recent: list[float] = field(default_factory=list)
    grad_share_recent: list[float] = field(default_factory=list)

    def remaining_s(self) -> float | None:
        """Seconds to the last step at the measured rate; None before a rate is known."""
        if self.seconds_per_step is None:
            return None
        return max(0, self.max_steps - self.step) * self.seconds_per_step


def write_progress(work_dir: str | Path, progress: MemberProgress) -> None:
    atomic_write_json(Path(work_dir) / PROGRESS_FILE, asdict(progress))


def read_progress(work_dir: str | Path) -> MemberProgress | None:
    try:
        data: dict[str, Any] = json.loads((Path(work_dir) / PROGRESS_FILE).read_text())
        known = {k: data[k] for k in MemberProgress.__dataclass_fields__ if k in data}
        return MemberProgress(**known)
    except (OSError, ValueError, TypeError):
        return None


def append_intermediate(work_dir: str | Path, step: int, pass_at_1: float, size: int) -> None:
    """One line for one intermediate validation of ``size`` problems after ``step`` optimizer steps."""
    line = json.dumps({"step": int(step), "pass_at_1": float(pass_at_1), "size": int(size), "time": time.time()})
    path = Path(work_dir) / INTERMEDIATE_FILE
    with open(path, "ab+") as handle:
        # after a crash mid-line, start a new line: the torn one stays unreadable, this one does not join it
        end = handle.seek(0, os.SEEK_END)
        torn = False
        if end:
            handle.seek(end - 1)
            torn = handle.read(1) != b"\n"
        handle.write((b"\n" if torn else b"") + line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_intermediate(work_dir: str | Path) -> dict[int, float]:
    """step -> pass@1 of every complete line, in step order; {} when the file is absent or unreadable."""
    try:
        text = (Path(work_dir) / INTERMEDIATE_FILE).read_text(encoding="utf-8")
    except OSError:
        return {}
    values: dict[int, float] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
            step, value = int(row["step"]), float(row["pass_at_1"])
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (killed mid-write) or a foreign line: skipped, never half-read
        values[step] = value
    return dict(sorted(values.items()))


def write_result(work_dir: str | Path, record: ResultRecord) -> Path:
    """Atomically write ``<work_dir>/result.json`` (the primitive: members go through ``write_final_result``)."""
    return atomic_write_json(Path(work_dir) / RESULT_FILE, record.to_dict())


def write_final_result(work_dir: str | Path, record: ResultRecord) -> ResultRecord:
    """Make ``record`` the member's result unless ``<work_dir>/result.json`` already holds one; return the record
    that is final now. Every writer of a member's result goes through here, so each member's file is written once.

    The member program records its own outcome (the inner loop's must: a single run has no job wrapper, and its
    checkpoints are deleted only after the record is durable); the job wrapper and the seed group then find it and
    write nothing. They write a record themselves only for what the entry point could not record: an exception it
    let through, the wall limit, an entry point that only returns its record (synthetic objectives). A final
    record is never replaced: a member that wrote `ok` and then ran out of time while settling its checkpoints did
    finish. The caller holds the member's lock (or is the only process on the directory), so reading first does
    not race another writer; the write is atomic, so a crash leaves no file or a whole one.
    """
    existing = read_result(work_dir)
    if existing is not None:
        return existing
    write_result(work_dir, record)
    return record


def write_result_if_absent(work_dir: str | Path, record: ResultRecord) -> bool:
    """Create ``<work_dir>/result.json`` only where none exists (True if created): how the orchestrator records
    an outcome it decided (timeout, failed), so that a member's own result, possibly not yet visible on this
    host, is never replaced."""
    return atomic_create_bytes(Path(work_dir) / RESULT_FILE, json_bytes(record.to_dict()))


def read_result(work_dir: str | Path) -> ResultRecord | None:
    """The record in ``<work_dir>/result.json``, or None if absent or unreadable (treated as not finished)."""
    path = Path(work_dir) / RESULT_FILE
    try:
        return ResultRecord.from_dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None
