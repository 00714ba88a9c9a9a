"""A trial on disk: trial.json (what it trains, written before any of its runs is submitted) and its member specs.

Trial ``n`` with ``seeds`` runs owns the member indices ``n * seeds + k`` of the tuner's one runner (jobs.json and
the launcher folder are shared by all trials), and run k trains with the k-th tuning seed, the same for every trial:
trials are compared on the same seeds (paired), like ES members with common random numbers.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from core.seeding import member_seed
from results.store.atomic import CorruptFileError, atomic_write_json
from results.store.layout import TRIAL_FILE, TRIALS_DIR, member_dir_name, trial_dir_name
from core.records import MemberSpec, ResultRecord

#: the ``generation`` every tuning run carries (job names, logs): one launcher folder holds them all
TUNE_GENERATION = 9997


def trials_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / TRIALS_DIR


def trial_dir(run_dir: str | Path, number: int) -> Path:
    return trials_dir(run_dir) / trial_dir_name(number)


def member_indices(number: int, seeds: int) -> list[int]:
    return [number * seeds + k for k in range(seeds)]


def run_seed(seed: int, k: int) -> int:
    """The k-th tuning seed (the same for every trial)."""
    return member_seed(seed, "tune_run", k)


@dataclass
class TrialPlan:
    """What trial ``number`` trains: its sampled ``params``, the overrides they became and each run's spec."""

    number: int
    slot: int
    params: dict[str, Any]
    overrides: list[str]
    specs: list[MemberSpec]

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "slot": self.slot, "params": self.params, "overrides": self.overrides,
                "members": [s.to_dict() for s in self.specs]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialPlan":
        return cls(number=int(data["number"]), slot=int(data["slot"]), params=dict(data["params"]),
                   overrides=list(data["overrides"]), specs=[MemberSpec.from_dict(m) for m in data["members"]])


def plan_trial(run_dir: str | Path, run_id: str, seed: int, number: int, slot: int, params: Mapping[str, Any],
               overrides: Sequence[str], inner: Mapping[str, Any], seeds: int) -> TrialPlan:
    folder = trial_dir(run_dir, number)
    specs = [MemberSpec(run_id=run_id, generation=TUNE_GENERATION, index=index, seed=run_seed(seed, k), params=[],
                        work_dir=str(folder / member_dir_name(k)), inner=dict(inner))
             for k, index in enumerate(member_indices(number, seeds))]
    return TrialPlan(number, slot, dict(params), list(overrides), specs)


def write_trial(run_dir: str | Path, plan: TrialPlan) -> None:
    """Atomically, before any of the trial's runs is submitted: a trial without this file was never started."""
    folder = trial_dir(run_dir, plan.number)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / TRIAL_FILE, plan.to_dict())


def read_trial(run_dir: str | Path, number: int) -> TrialPlan | None:
    """The trial's plan, None when it was never written; CorruptFileError when it does not parse."""
    path = trial_dir(run_dir, number) / TRIAL_FILE
    try:
        return TrialPlan.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptFileError(f"{path} is unreadable ({exc})") from exc


def objective(records: Sequence[ResultRecord]) -> tuple[float | None, str]:
    """The trial's value, the mean validation pass@1 of its runs, or None with the reason when any run did not
    end ok (a mean over the seeds that happened to succeed would compare trials on different seeds)."""
    bad = [r for r in records if not r.ok or r.fitness is None or not math.isfinite(r.fitness)]
    if bad:
        first = bad[0]
        return None, f"{len(bad)}/{len(records)} run(s) did not end ok; first: {first.status}: " \
                     f"{(first.error or '').strip()[-300:]}"
    return statistics.fmean(float(r.fitness) for r in records), ""
