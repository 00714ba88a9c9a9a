"""The search's scalars per generation in TensorBoard (``tensorboard --logdir <run_dir>/tensorboard``).

One event file per generation, written in a temporary directory and moved into place whole, so a crash never
leaves a torn one, and a resumed search neither repeats a generation's points (its file exists) nor loses one
(``log_missing`` writes every finished generation that has no file yet, from the tables).

The file is named after its generation, not the clock: TensorBoard reads a folder's event files in name order
and drops every point whose step is at or after one that comes later in that order, so a generation backfilled
on resume (written after its successors) must still sort before them.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from results.store.layout import TENSORBOARD_DIR

if TYPE_CHECKING:
    from results.store.run_store import RunStore

_MARK = ".gen"


def _marker(generation: int) -> str:
    return f"{_MARK}{generation:04d}"


def _file_name(generation: int) -> str:
    """``events.out.tfevents.<generation, zero-padded>.gen<generation>``: name order is generation order."""
    return f"events.out.tfevents.{generation:010d}{_marker(generation)}"


def logged_generations(run_dir: str | Path) -> set[int]:
    """Generations whose event file is in place."""
    folder = Path(run_dir) / TENSORBOARD_DIR
    found = set()
    for path in folder.glob(f"events.out.tfevents.*{_MARK}*"):
        tail = path.name.rsplit(_MARK, 1)[-1]
        if tail.isdigit():
            found.add(int(tail))
    return found


def write_generation(run_dir: str | Path, generation: int, scalars: Mapping[str, float], wall_time: float | None = None) -> Path | None:
    """Write one generation's scalars (NaN ones skipped) as its own event file; None if it was already there."""
    from torch.utils.tensorboard import SummaryWriter

    folder = Path(run_dir) / TENSORBOARD_DIR
    if generation in logged_generations(run_dir):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".writing-") as tmp:
        writer = SummaryWriter(log_dir=tmp, filename_suffix=_marker(generation))
        for tag, value in scalars.items():
            if value is not None and math.isfinite(float(value)):
                writer.add_scalar(tag, float(value), global_step=generation, walltime=wall_time)
        writer.close()
        (event,) = Path(tmp).glob("events.out.tfevents.*")
        target = folder / _file_name(generation)
        os.replace(event, target)
    return target


def generation_scalars(store: "RunStore", generation: int) -> dict[str, float]:
    """The generation's scalars from the tables and its population (the same numbers on a live run and a backfill)."""
    members = store.read_members()
    gens = store.read_generations()
    group = members[members["generation"] == generation] if len(members) else members
    role = group["role"].fillna("member") if "role" in group else None
    population = group[role == "member"] if role is not None else group
    ok = population[population["status"] == "ok"]["fitness"].astype(float)
    row = gens[gens["generation"] == generation].iloc[0] if len(gens) and (gens["generation"] == generation).any() else {}
    values = store.read_population(generation)
    scalars = {
        "fitness/mean": ok.mean() if len(ok) else math.nan,
        "fitness/median": ok.median() if len(ok) else math.nan,
        "fitness/max": ok.max() if len(ok) else math.nan,
        "fitness/std": ok.std(ddof=1) if len(ok) > 1 else math.nan,
        "fitness/control": float(row.get("control_fitness", math.nan)) if len(row) else math.nan,
        "search/center_norm": float(row.get("center_norm", math.nan)) if len(row) else math.nan,
        "search/spread": float(values.double().std(dim=0).mean()) if values is not None and values.shape[0] > 1
        else math.nan,
        "members/failed": float(row.get("failed", math.nan)) if len(row) else math.nan,
        "members/late": float(row.get("late", 0)) if len(row) else math.nan,
        "members/stopped_early": float(row.get("stopped_early", 0)) if len(row) else math.nan,
        "time/member_seconds_saved": float(row.get("member_seconds_saved", 0.0)) if len(row) else math.nan,
        "time/generation_wall_s": float(row.get("wall_time_s", math.nan)) if len(row) else math.nan,
    }
    return {k: float(v) for k, v in scalars.items()}


def log_missing(store: "RunStore") -> list[int]:
    """Write the event file of every generation that has a state but no event file yet (a resumed search)."""
    written = []
    for generation in sorted(set(store.state_generations()) - logged_generations(store.root)):
        if write_generation(store.root, generation, generation_scalars(store, generation)) is not None:
            written.append(generation)
    return written
