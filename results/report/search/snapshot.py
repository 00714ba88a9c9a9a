"""A tolerant read of an ES run directory: what is known right now, and what could not be read.

The orchestrator's tables only cover generations that finished; a live generation exists only as member dirs
(some with result.json) beside its population file. So the member table is rebuilt from both: table rows where
the table has them, result.json otherwise, and ``pending`` for members without either. Every unreadable file
(bad parquet, bad result.json, state failing its checksum, unreadable population or manifest) is skipped and
named in ``skipped`` instead of aborting the report.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from results.store.atomic import CorruptFileError
from results.store.gpu_share import read_gpu_share, share_text
from results.store.layout import RESULT_FILE, parse_generation_dir_name, parse_member_dir_name
from results.store.provenance import read_run_manifest
from core.records import STOPPED_EARLY, ResultRecord, device_text
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)

PENDING = "pending"
UNREADABLE = "unreadable"
MEMBER_COLUMNS = ["generation", "index", "status", "fitness", "mean_response_tokens", "wall_time_s", "steps_done",
                  "disk_peak_bytes", "error", "source"]


@dataclass
class RunSnapshot:
    root: Path
    manifest: dict[str, Any]
    members: pd.DataFrame  # MEMBER_COLUMNS (+ fitness_used and diag_* where the table has them)
    generations: pd.DataFrame  # see generation_table
    skipped: list[str] = field(default_factory=list)
    data_hashes: list[str] = field(default_factory=list)


def _generation_dirs(store: RunStore) -> dict[int, Path]:
    if not store.root.is_dir():
        return {}
    found = {}
    for path in store.root.iterdir():
        generation = parse_generation_dir_name(path.name)
        if generation is not None and path.is_dir():
            found[generation] = path
    return found


def _member_dirs(gen_dir: Path) -> dict[int, Path]:
    found = {}
    for path in gen_dir.iterdir():
        index = parse_member_dir_name(path.name)
        if index is not None and path.is_dir():
            found[index] = path
    return found


def _read_table(path: Path, what: str, skipped: list[str]) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame()
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a truncated or foreign file
        skipped.append(f"{path}: unreadable ({type(exc).__name__}); {what}")
        return pd.DataFrame()


def _member_row_from_dir(generation: int, index: int, member_dir: Path, skipped: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"generation": generation, "index": index, "status": PENDING, "source": "none"}
    path = member_dir / RESULT_FILE
    if not path.exists():
        return row
    try:
        record = ResultRecord.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
        skipped.append(f"{path}: unreadable ({exc}); member counted as {UNREADABLE}")
        row.update(status=UNREADABLE, source=RESULT_FILE)
        return row
    row.update(status=record.status, fitness=record.fitness if record.ok else float("nan"),
               mean_response_tokens=record.mean_response_tokens if record.ok else float("nan"),
               wall_time_s=record.wall_time_s, steps_done=record.steps_done, error=record.error[-500:],
               disk_peak_bytes=_bytes_or_nan(record.disk_peak_bytes), source=RESULT_FILE,
               device=device_text(record.device),
               peak_gpu_memory_bytes=_bytes_or_nan(record.device.get("peak_memory_bytes")),
               gpu_share=share_text(read_gpu_share(member_dir)))  # as the orchestrator's members table has it
    return row


def _bytes_or_nan(value: int | None) -> float:
    return float("nan") if value is None else float(value)


def _disk_from_result(member_dir: Path) -> float:
    """A member's peak disk use from its result.json, for table rows that lack it (the orchestrator's table may
    not carry the column); NaN when unknown. Unreadable files are already reported by the row's own source."""
    try:
        record = ResultRecord.from_dict(json.loads((member_dir / RESULT_FILE).read_text()))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError):
        return float("nan")
    return _bytes_or_nan(record.disk_peak_bytes)


def _population_info(store: RunStore, generation: int, skipped: list[str]) -> tuple[int | None, float]:
    """(population size, search spread = mean per-coordinate std of the asked population)."""
    path = store.population_path(generation)
    if not path.exists():
        return None, float("nan")
    values = store.read_population(generation)  # None when corrupt (it logs the reason)
    if values is None:
        skipped.append(f"{path}: fails its checksum or cannot be loaded; search spread unknown for this generation")
        return None, float("nan")
    spread = float(values.double().std(dim=0).mean()) if values.shape[0] > 1 else float("nan")
    return int(values.shape[0]), spread


def _valid_states(store: RunStore, skipped: list[str]) -> set[int]:
    valid = set()
    for generation in store.state_generations():
        try:
            store.read_state(generation)
        except CorruptFileError as exc:
            skipped.append(f"{exc}; generation {generation} is shown from member files and a resume would redo it")
            continue
        valid.add(generation)
    return valid


def load_run(run_dir: str | Path) -> RunSnapshot:
    """Read everything readable in ``run_dir``. Raises ValueError only if it is not a run dir at all."""
    store = RunStore(run_dir)
    gen_dirs = _generation_dirs(store)
    if not store.root.is_dir() or not (store.exists() or store.manifest_path.exists() or gen_dirs
                                       or store.tables_dir.is_dir()):
        raise ValueError(f"{run_dir}: not an ES run directory (no config.yaml, manifest.json, gen_* or tables/); "
                         "pass the run_dir given to python -m meta.run")
    skipped: list[str] = []
    try:
        manifest = store.read_manifest()
    except CorruptFileError as exc:
        skipped.append(f"{exc}; provenance unknown")
        manifest = {}
    table = _read_table(store.members_table_path, "member rows rebuilt from result.json files", skipped)
    gen_table = _read_table(store.generations_table_path, "generation wall times unknown", skipped)
    states = _valid_states(store, skipped)

    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for record in table.to_dict("records"):
        key = (int(record["generation"]), int(record["index"]))
        record.update(generation=key[0], index=key[1], source="table")
        if record.get("status") != "ok":
            record["fitness"] = float("nan")
            record["mean_response_tokens"] = float("nan")
        rows[key] = record
    populations: dict[int, tuple[int | None, float]] = {}
    data_hashes: set[str] = set()
    for generation, gen_dir in sorted(gen_dirs.items()):
        populations[generation] = _population_info(store, generation, skipped)
        members = _member_dirs(gen_dir)
        size = populations[generation][0]
        indices = set(members) | (set(range(size)) if size else set())
        for index in sorted(indices):
            member_dir = members.get(index)
            if member_dir is not None:
                data_hashes.update(_member_data_hashes(member_dir))
            if (generation, index) in rows:
                row = rows[(generation, index)]
                if member_dir is not None and pd.isna(row.get("disk_peak_bytes", float("nan"))):
                    row["disk_peak_bytes"] = _disk_from_result(member_dir)
                continue
            if member_dir is None:
                rows[(generation, index)] = {"generation": generation, "index": index, "status": PENDING,
                                             "source": "none"}
            else:
                rows[(generation, index)] = _member_row_from_dir(generation, index, member_dir, skipped)
    members_df = pd.DataFrame(list(rows.values()))
    for column in MEMBER_COLUMNS:
        if column not in members_df.columns:
            members_df[column] = float("nan") if column not in ("status", "error", "source") else ""
    if len(members_df):
        members_df = members_df.sort_values(["generation", "index"]).reset_index(drop=True)
        members_df["role"] = [_role(row, populations) for row in members_df.to_dict("records")]
    members_df = members_df[MEMBER_COLUMNS + [c for c in members_df.columns if c not in MEMBER_COLUMNS]]
    generations = generation_table(members_df, gen_table, populations, states, store)
    return RunSnapshot(store.root, manifest, members_df, generations, skipped, sorted(data_hashes))


def _role(row: dict[str, Any], populations: dict[int, tuple[int | None, float]]) -> str:
    """The table's role; for rows rebuilt from files: the member at index == population is the control."""
    role = row.get("role")
    if isinstance(role, str) and role:
        return role
    size = populations.get(int(row["generation"]), (None, 0.0))[0]
    return "control" if size is not None and int(row["index"]) == size else "member"


def _member_data_hashes(member_dir: Path) -> set[str]:
    try:
        manifest = read_run_manifest(member_dir)
    except CorruptFileError:
        return set()
    hashes = (manifest or {}).get("data_hashes") or {}
    return {",".join(f"{k}:{v}" for k, v in sorted(hashes.items()))} if isinstance(hashes, dict) and hashes else set()


def generation_table(members: pd.DataFrame, gen_table: pd.DataFrame, populations: dict[int, tuple[int | None, float]],
                     states: set[int], store: RunStore) -> pd.DataFrame:
    """Per generation: state, member counts, fitness statistics over ok members, search spread, wall time, disk.

    Fitness statistics use only members that finished ok (failures are counted, not averaged as zeros), so the
    numbers are validation pass@1 of the population; ``fitness_used`` in the members table is what the searcher saw.
    """
    gens = set(members["generation"].dropna().astype(int)) if len(members) else set()
    gens |= set(populations) | states
    if len(gen_table) and "generation" in gen_table:
        gens |= set(gen_table["generation"].astype(int))
    recorded_wall, recorded_saving = {}, {}
    if len(gen_table) and {"generation", "wall_time_s"} <= set(gen_table.columns):
        recorded_wall = dict(zip(gen_table["generation"].astype(int), gen_table["wall_time_s"].astype(float)))
    if len(gen_table) and {"generation", "member_seconds_saved"} <= set(gen_table.columns):
        recorded_saving = dict(zip(gen_table["generation"].astype(int),
                                   gen_table["member_seconds_saved"].astype(float).fillna(0.0)))
    rows = []
    for generation in sorted(gens):
        everyone = members[members["generation"] == generation] if len(members) else members
        role = everyone["role"] if "role" in everyone else pd.Series("member", index=everyone.index)
        group, control = everyone[role == "member"], everyone[(role == "control") & (everyone["status"] == "ok")]
        ok = group[group["status"] == "ok"]
        fitness = ok["fitness"].astype(float)
        # Every member that measured its disk counts (a failed one used disk too); members run side by side, so
        # the sum of their peaks is what a generation may need at once.
        disk = everyone["disk_peak_bytes"].astype(float).dropna() if len(everyone) else pd.Series(dtype=float)
        failed = int(group["status"].isin(["failed", "timeout", "cancelled"]).sum())
        pending = int((group["status"] == PENDING).sum())
        wall = recorded_wall.get(generation, float("nan"))
        if generation not in states and pd.isna(wall) and store.population_path(generation).exists():
            wall = time.time() - store.population_path(generation).stat().st_mtime  # elapsed so far
        rows.append({
            "generation": generation,
            "state": "done" if generation in states else ("in progress" if pending else "not recorded"),
            "members": len(group),
            "ok": len(ok),
            "failed": failed,
            "unreadable": int((group["status"] == UNREADABLE).sum()),
            "pending": pending,
            "late": int((group["status"] == "late").sum()),
            "stopped_early": int((group["status"] == STOPPED_EARLY).sum()),
            "member_seconds_saved": recorded_saving.get(generation, 0.0),
            "control_fitness": float(control["fitness"].iloc[0]) if len(control) else float("nan"),
            "mean_fitness": fitness.mean() if len(ok) else float("nan"),
            "median_fitness": fitness.median() if len(ok) else float("nan"),
            "max_fitness": fitness.max() if len(ok) else float("nan"),
            "std_fitness": fitness.std(ddof=1) if len(ok) > 1 else float("nan"),
            "search_spread": populations.get(generation, (None, float("nan")))[1],
            "mean_response_tokens": ok["mean_response_tokens"].astype(float).mean() if len(ok) else float("nan"),
            "wall_time_s": wall,
            "disk_peak_max": disk.max() if len(disk) else float("nan"),
            "disk_peak_mean": disk.mean() if len(disk) else float("nan"),
            "disk_peak_sum": disk.sum() if len(disk) else float("nan"),
        })
    return pd.DataFrame(rows, columns=GENERATION_COLUMNS)


GENERATION_COLUMNS = ["generation", "state", "members", "ok", "failed", "unreadable", "pending", "late",
                      "stopped_early", "member_seconds_saved",
                      "control_fitness", "mean_fitness",
                      "median_fitness", "max_fitness", "std_fitness", "search_spread", "mean_response_tokens",
                      "wall_time_s", "disk_peak_max", "disk_peak_mean", "disk_peak_sum"]


def top_members(members: pd.DataFrame, k: int = 10) -> pd.DataFrame:
    """The ``k`` best population members that finished ok, best first (ties: earlier generation, lower index)."""
    ok = members[members["status"] == "ok"]
    if "role" in ok:
        ok = ok[ok["role"] != "control"]
    columns = ["generation", "index", "fitness", "mean_response_tokens", "wall_time_s", "steps_done", "disk_peak_bytes"]
    ranked = ok.sort_values(["fitness", "generation", "index"], ascending=[False, True, True])
    return ranked[columns].head(k).reset_index(drop=True)
