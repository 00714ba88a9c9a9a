"""The run store: paths and typed, atomic reads/writes of everything inside one run directory.

The layout itself (every file and directory name, and the tree they form) is spelled in results/store/layout.py;
this module joins those names into the paths of one run dir and reads and writes what lies there.

Everything is written atomically; state and population files carry a checksum so that a torn or corrupted
file is detected and skipped instead of silently trusted. torch and pandas are imported lazily so that code
running inside light member processes can import this package without paying for them.
"""
from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from results.store.atomic import (
    CorruptFileError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_with_checksum,
    write_with_checksum,
)
from results.store.layout import (
    BEST_DIR,
    BEST_MEMBER_FILE,
    CANDIDATES_FILE,
    CLOSED_FILE,
    EARLY_STOP_FILE,
    CONFIG_FILE,
    GENERATIONS_TABLE_FILE,
    JOBS_FILE,
    LAUNCHER_DIR,
    MEMBERS_TABLE_FILE,
    PARTICLES_DIR,
    PILOT_FILE,
    PILOT_PLAN_FILE,
    PILOT_RUNS_DIR,
    POPULATION_FILE,
    REEVALUATE_DIR,
    REEVALUATION_FILE,
    RUN_LOCK_FILE,
    SEARCH_MANIFEST_FILE,
    STATE_DIR,
    TABLES_DIR,
    REPORT_ROWS_FILE,
    REPORTING_DIR,
    RESULT_FILE,
    RESULT_TABLE_FILE,
    archived_reevaluate_dir_name,
    archived_reporting_dir_name,
    generation_dir_name,
    particle_dir_name,
    member_dir_name,
    parse_member_dir_name,
    parse_state_file_name,
    state_file_name,
)

logger = logging.getLogger(__name__)

MEMBER_KEYS = ("generation", "index")


class RunStore:
    """Paths and typed reads/writes of one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir)

    # ----------------------------------------------------------------- paths
    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def manifest_path(self) -> Path:
        return self.root / SEARCH_MANIFEST_FILE

    @property
    def lock_path(self) -> Path:
        return self.root / RUN_LOCK_FILE

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def tables_dir(self) -> Path:
        return self.root / TABLES_DIR

    @property
    def members_table_path(self) -> Path:
        return self.tables_dir / MEMBERS_TABLE_FILE

    @property
    def generations_table_path(self) -> Path:
        return self.tables_dir / GENERATIONS_TABLE_FILE

    @property
    def best_dir(self) -> Path:
        return self.tables_dir / BEST_DIR

    @property
    def best_member_path(self) -> Path:
        return self.best_dir / BEST_MEMBER_FILE

    def state_path(self, generation: int) -> Path:
        return self.state_dir / state_file_name(generation)

    def generation_dir(self, generation: int) -> Path:
        return self.root / generation_dir_name(generation)

    def population_path(self, generation: int) -> Path:
        return self.generation_dir(generation) / POPULATION_FILE

    def jobs_path(self, generation: int) -> Path:
        return self.generation_dir(generation) / JOBS_FILE

    def member_dir(self, generation: int, index: int) -> Path:
        return self.generation_dir(generation) / member_dir_name(index)

    def particle_dir(self, index: int) -> Path:
        """es=nres: the folder of particle ``index``'s boundary checkpoints (results/store/truncation.py)."""
        return self.root / PARTICLES_DIR / particle_dir_name(index)

    def launcher_dir(self, generation: int) -> Path:
        return self.generation_dir(generation) / LAUNCHER_DIR

    def closed_path(self, generation: int) -> Path:
        return self.generation_dir(generation) / CLOSED_FILE

    def early_stop_path(self, generation: int) -> Path:
        return self.generation_dir(generation) / EARLY_STOP_FILE

    def reevaluate_dir(self, reporting: bool = False) -> Path:
        """The re-evaluation's directory: stage A (selection), or with ``reporting`` stage B's inside it; each laid
        out like a generation dir: jobs.json, member_NNN/, submitit/."""
        root = self.root / REEVALUATE_DIR
        return root / REPORTING_DIR if reporting else root

    def reevaluation_progress(self, reporting: bool = False) -> tuple[int, int]:
        """(runs with their final record, runs on disk) of a re-evaluation stage (``reevaluate_dir``)."""
        folder = self.reevaluate_dir(reporting)
        members = [p for p in folder.iterdir() if parse_member_dir_name(p.name) is not None] if folder.is_dir() else []
        return sum(1 for p in members if (p / RESULT_FILE).is_file()), len(members)

    @property
    def report_rows_path(self) -> Path:
        return self.reevaluate_dir(reporting=True) / REPORT_ROWS_FILE

    @property
    def result_table_path(self) -> Path:
        return self.reevaluate_dir(reporting=True) / RESULT_TABLE_FILE

    @property
    def candidates_path(self) -> Path:
        return self.root / REEVALUATE_DIR / CANDIDATES_FILE

    @property
    def reevaluation_path(self) -> Path:
        return self.root / REEVALUATE_DIR / REEVALUATION_FILE

    def exists(self) -> bool:
        """True when a run was started here (its resolved config was written)."""
        return self.config_path.is_file()

    # ---------------------------------------------------------- config/meta
    def write_config(self, yaml_text: str) -> None:
        atomic_write_text(self.config_path, yaml_text)

    def read_config_text(self) -> str:
        return self.config_path.read_text()

    def write_manifest(self, manifest: Mapping[str, Any]) -> None:
        atomic_write_json(self.manifest_path, dict(manifest))

    def read_manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise CorruptFileError(f"{self.manifest_path}: not valid JSON ({exc})") from exc

    # ----------------------------------------------------------------- state
    def write_state(self, generation: int, state: Mapping[str, Any]) -> Path:
        """Persist the searcher state after ``generation``'s tell (torch.save of plain data, checksummed)."""
        return write_with_checksum(self.state_path(generation), _torch_bytes(dict(state)))

    def state_generations(self) -> list[int]:
        if not self.state_dir.is_dir():
            return []
        found = (parse_state_file_name(p.name) for p in self.state_dir.iterdir())
        return sorted(g for g in found if g is not None)

    def read_state(self, generation: int) -> dict[str, Any]:
        return _torch_load(read_with_checksum(self.state_path(generation)), self.state_path(generation))

    def latest_state(self) -> tuple[int, dict[str, Any]] | None:
        """The newest state that passes its checksum; corrupt newer ones are skipped with a warning."""
        for generation in reversed(self.state_generations()):
            try:
                return generation, self.read_state(generation)
            except CorruptFileError as exc:
                logger.warning("skipping corrupt state file (falling back to the previous generation): %s", exc)
        return None

    # ------------------------------------------------------------ population
    def write_population(self, generation: int, values: Any) -> Path:
        """``values``: a (population, dim) float64 tensor, written before any member of it is submitted."""
        payload = {"generation": int(generation), "values": values}
        return write_with_checksum(self.population_path(generation), _torch_bytes(payload))

    def read_population(self, generation: int) -> Any | None:
        """The asked population of ``generation``, or None if it was never written or is corrupt."""
        path = self.population_path(generation)
        if not path.exists():
            return None
        try:
            payload = _torch_load(read_with_checksum(path), path)
        except CorruptFileError as exc:
            logger.warning("population file is corrupt and will be asked again: %s", exc)
            return None
        if payload.get("generation") != generation:
            logger.warning("population file %s names generation %s; asking again", path, payload.get("generation"))
            return None
        return payload["values"]

    # ------------------------------------------------------------------ jobs
    def write_jobs(self, generation: int, jobs: Mapping[int, Mapping[str, Any]]) -> None:
        write_jobs_file(self.jobs_path(generation), jobs)

    def read_jobs(self, generation: int) -> dict[int, dict[str, Any]]:
        return read_jobs_file(self.jobs_path(generation))

    # ------------------------------------------------------ generation close
    def write_closed(self, generation: int, record: Mapping[str, Any]) -> None:
        """The quorum decision (which members are late), written before any of them is cancelled."""
        atomic_write_json(self.closed_path(generation), dict(record))

    def read_closed(self, generation: int) -> dict[str, Any] | None:
        """The generation's quorum decision, or None if it did not close early. A file that exists but does not
        parse is an error, not "not closed": settling those members differently would change the update."""
        return _read_json_or_none(self.closed_path(generation))

    def write_early_stop(self, generation: int, record: Mapping[str, Any]) -> None:
        """early_stop's decisions so far, written before any stopped member is cancelled."""
        atomic_write_json(self.early_stop_path(generation), dict(record))

    def read_early_stop(self, generation: int) -> dict[str, Any] | None:
        """The generation's early_stop decisions, or None before the first; an unreadable file is an error."""
        return _read_json_or_none(self.early_stop_path(generation))

    # --------------------------------------------------------- re-evaluation
    def write_candidates(self, record: Mapping[str, Any]) -> None:
        atomic_write_json(self.candidates_path, dict(record))

    def read_candidates(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.candidates_path)

    def write_reevaluation(self, record: Mapping[str, Any]) -> None:
        atomic_write_json(self.reevaluation_path, dict(record))

    def read_reevaluation(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.reevaluation_path)

    def write_report_rows(self, record: Mapping[str, Any]) -> None:
        atomic_write_json(self.report_rows_path, dict(record))

    def read_report_rows(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.report_rows_path)

    def write_result_table(self, record: Mapping[str, Any]) -> None:
        atomic_write_json(self.result_table_path, dict(record))

    def read_result_table(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.result_table_path)

    def archive_reporting(self) -> Path:
        """Move stage B's directory aside inside the re-evaluation dir (a rename: nothing deleted)."""
        k = 0
        while (self.reevaluate_dir() / archived_reporting_dir_name(k)).exists():
            k += 1
        target = self.reevaluate_dir() / archived_reporting_dir_name(k)
        os.replace(self.reevaluate_dir(reporting=True), target)
        return target

    def archive_reevaluation(self) -> Path:
        """Move the re-evaluation dir aside (a rename: nothing deleted) under the first free archive name."""
        k = 0
        while (self.root / archived_reevaluate_dir_name(k)).exists():
            k += 1
        target = self.root / archived_reevaluate_dir_name(k)
        os.replace(self.reevaluate_dir(), target)
        return target

    # ---------------------------------------------------------------- tables
    def upsert_members(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert or replace member rows keyed by (generation, index); re-running a generation is idempotent."""
        _upsert_parquet(self.members_table_path, list(rows), MEMBER_KEYS)

    def upsert_generation(self, row: Mapping[str, Any]) -> None:
        _upsert_parquet(self.generations_table_path, [dict(row)], ("generation",))

    def read_members(self) -> Any:
        return _read_parquet(self.members_table_path)

    def read_generations(self) -> Any:
        return _read_parquet(self.generations_table_path)

    def write_best(self, record: Mapping[str, Any]) -> None:
        """The best member seen so far (params included), for export without loading the tables."""
        atomic_write_json(self.best_member_path, dict(record))

    def read_best(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.best_member_path.read_text())
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------- pilot (meta/pilot/cli.py)
    @property
    def pilot_runs_dir(self) -> Path:
        """Every run of a pilot, laid out like a generation dir: jobs.json, member_NNN/, submitit/."""
        return self.root / PILOT_RUNS_DIR

    @property
    def pilot_plan_path(self) -> Path:
        return self.root / PILOT_PLAN_FILE

    @property
    def pilot_path(self) -> Path:
        return self.root / PILOT_FILE

    def write_pilot_plan(self, plan: Mapping[str, Any]) -> None:
        atomic_write_json(self.pilot_plan_path, dict(plan))

    def read_pilot_plan(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.pilot_plan_path)

    def write_pilot(self, summary: Mapping[str, Any]) -> None:
        atomic_write_json(self.pilot_path, dict(summary))

    def read_pilot(self) -> dict[str, Any] | None:
        return _read_json_or_none(self.pilot_path)


def write_jobs_file(path: Path, jobs: Mapping[int, Mapping[str, Any]]) -> None:
    """A phase's member -> job map (a generation's, the re-evaluation's), written right after each submission."""
    atomic_write_json(path, {"members": {str(k): dict(v) for k, v in jobs.items()}})


def read_jobs_file(path: Path) -> dict[int, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError:
        logger.warning("%s is unreadable; in-flight jobs of that phase cannot be re-attached", path)
        return {}
    return {int(k): dict(v) for k, v in data.get("members", {}).items()}


def _read_json_or_none(path: Path) -> dict[str, Any] | None:
    """A JSON file written atomically by this store: None if absent; CorruptFileError if it does not parse
    (atomic writes never leave a torn file, so this is damage to look at, never to guess over)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptFileError(f"{path}: not valid JSON ({exc}); inspect or delete it") from exc
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: expected a JSON object")
    return data


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _torch_load(data: bytes, path: Path) -> dict[str, Any]:
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for malformed archives
        raise CorruptFileError(f"{path}: cannot be loaded ({exc})") from exc
    if not isinstance(obj, dict):
        raise CorruptFileError(f"{path}: expected a dict, found {type(obj).__name__}")
    return obj


def _read_parquet(path: Path) -> Any:
    import pandas as pd

    if not path.exists():
        return pd.DataFrame()
    return pd.read_parquet(path)


def _upsert_parquet(path: Path, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    import pandas as pd

    if not rows:
        return
    new = pd.DataFrame(rows)
    old = _read_parquet(path)
    if len(old):
        merged = pd.concat([old, new], ignore_index=True)
        merged = merged.drop_duplicates(subset=list(keys), keep="last")
    else:
        merged = new
    merged = merged.sort_values(list(keys)).reset_index(drop=True)
    buffer = io.BytesIO()
    merged.to_parquet(buffer, index=False)
    atomic_write_bytes(path, buffer.getvalue())
