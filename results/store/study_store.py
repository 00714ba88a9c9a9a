"""Where a tune run's Optuna study lives, and how anyone (the tuner, the report, a user) opens it.

study.json in the tune run dir records the storage and the study name; it is written once, atomically, before the
first trial. The default storage is Optuna's JournalStorage on ``<run_dir>/optuna_journal.log`` with its
open(O_CREAT|O_EXCL) lock file (JournalFileOpenLock), which works on NFS where flock may not; any SQLAlchemy URL
(``sqlite:////abs/study.db``, ``postgresql://...``, ``mysql+pymysql://...``) is an RDB storage instead. The same
study opens in a notebook or optuna-dashboard::

    optuna.load_study(study_name=..., storage=open_storage(...))    # or the RDB URL itself
    optuna-dashboard sqlite:////abs/study.db                          # optuna-dashboard <run_dir>/optuna_journal.log
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from results.store.atomic import CorruptFileError, atomic_write_json
from results.store.layout import JOURNAL_FILE, STUDY_FILE

if TYPE_CHECKING:
    import optuna

#: user attrs meta.tune sets on trials, read by the report and the export: why a trial was lost (FAIL, not counted),
#: its slot (the sampler seed's index), why it failed, where it was pruned and the running time that saved, and the
#: validation pass@1 of each of its runs
LOST_ATTR, SLOT_ATTR, ERROR_ATTR = "lost", "slot", "error"
PRUNED_STEP_ATTR, SAVED_ATTR, RUN_VALUES_ATTR = "pruned_at_step", "saved_member_s", "run_values"
#: the study-level user attribute naming the tune run (manifest run_id) that created the study
RUN_ID_ATTR = "run_id"

#: study.json's ``storage`` for the default journal file (its path is the run dir's JOURNAL_FILE)
JOURNAL = "journal"
#: SQLite waits this long for a lock held by another connection before "database is locked"
SQLITE_TIMEOUT_S = 60


def journal_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / JOURNAL_FILE


def open_storage(run_dir: str | Path, storage: str) -> "optuna.storages.BaseStorage":
    """The study's storage: ``storage`` is JOURNAL (the run dir's journal file) or an RDB URL."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    if storage == JOURNAL:
        path = str(journal_path(run_dir))
        return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    engine_kwargs: dict[str, Any] = {}
    if storage.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
    return optuna.storages.RDBStorage(storage, engine_kwargs=engine_kwargs)


def state_name(trial: "optuna.trial.FrozenTrial") -> str:
    """LOST for a trial the tuner lost (FAIL in the study, not counted toward tune.trials), else Optuna's state."""
    return "LOST" if trial.user_attrs.get(LOST_ATTR) else trial.state.name


def state_counts(trials: "Iterable[optuna.trial.FrozenTrial]") -> dict[str, int]:
    """How many trials are in each state_name, sorted by name."""
    return dict(sorted(Counter(state_name(t) for t in trials).items()))


def best_complete_trial(study: "optuna.Study") -> "optuna.trial.FrozenTrial | None":
    """The complete trial with the highest finite value (ties: the lower trial number), None when there is none.
    The one rule the tuner's summary, the report, the status and the export all use."""
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and math.isfinite(t.value)]
    return max(complete, key=lambda t: (t.value, -t.number)) if complete else None


def write_study_file(run_dir: str | Path, content: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / STUDY_FILE, content)


def read_study_file(run_dir: str | Path) -> dict[str, Any] | None:
    """study.json, or None when the run dir has none (not a tune run); CorruptFileError when it does not parse."""
    path = Path(run_dir) / STUDY_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"{path} is unreadable ({exc}); it names the study's storage: restore it") from exc
    if not isinstance(data, dict) or not isinstance(data.get("storage"), str) or not data.get("study_name"):
        raise CorruptFileError(f"{path} lacks storage/study_name; it names the study's storage: restore it")
    return data


def load_study(run_dir: str | Path) -> "optuna.Study":
    """The tune run's study, read-only use (report, status, export); ValueError when run_dir is not a tune run."""
    import optuna

    info = read_study_file(run_dir)
    if info is None:
        raise ValueError(f"{run_dir} is not a tune run dir (no {STUDY_FILE})")
    return optuna.load_study(study_name=info["study_name"], storage=open_storage(run_dir, info["storage"]))
