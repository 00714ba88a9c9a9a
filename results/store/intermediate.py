"""Intermediate validation scores of a running member: ``intermediate.jsonl`` in its work dir.

A member trained with ``train.eval_every`` appends one line per intermediate validation (``{"step", "pass_at_1",
"size", "time"}``), which a tuner reads to report to its pruner (meta/tune/). Append-only JSON lines, flushed and
fsynced per line: a crash mid-write leaves at most a torn line, which the reader skips and the next append does
not join; a member resumed from a checkpoint may score a step again, and the reader keeps the latest line per step
(the run that continued).
Standard library only: member processes import it.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from results.store.layout import INTERMEDIATE_FILE


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
