"""A member trained on several seeds (``seeds_per_member``): one run per seed, its fitness their mean.

Seed noise of one training run is often as large as the differences a search is looking for; averaging k runs
divides its variance by k. Each seed's run is a member of its own (own work dir ``seed_NN/``, own result.json,
the entry point's own resume), so a retry or a requeue of the member re-runs only the seeds without a final
result. Every member of a generation gets the same seeds (common random numbers, fresh per generation).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any, Callable

from results.store.atomic import atomic_write_json
from results.store.layout import RESULT_FILE, SPEC_FILE, archived_result_name, seed_dir_name
from core.records import MEMBER_SEEDS_KEY, MemberSpec, ResultRecord
from results.store.member_files import read_result, write_final_result

logger = logging.getLogger(__name__)


def member_seeds(member: MemberSpec) -> list[int]:
    """The seeds a member trains on: the inner config's list, or its own seed alone."""
    seeds = member.inner.get(MEMBER_SEEDS_KEY)
    return [int(s) for s in seeds] if seeds else [member.seed]


def seed_spec(member: MemberSpec, k: int, seed: int) -> MemberSpec:
    """The member's run on its k-th seed: same params and inner config, its own work dir and seed."""
    inner = {key: value for key, value in member.inner.items() if key != MEMBER_SEEDS_KEY}
    return dataclasses.replace(member, seed=seed, inner=inner, work_dir=str(Path(member.work_dir) / seed_dir_name(k)))


def run_seed_group(fn: Callable[[MemberSpec], Any], member: MemberSpec) -> ResultRecord:
    """Run ``fn`` once per seed (skipping seeds whose final result exists) and return the mean record. The first
    seed that does not finish ok ends the member with that seed's status and error (a retry resumes there)."""
    records = []
    for k, seed in enumerate(member_seeds(member)):
        spec = seed_spec(member, k, seed)
        record = read_result(spec.work_dir)
        if record is not None and not record.ok and _earlier_attempt(spec) is not None:
            record = None  # this seed failed on an earlier attempt of the member: the retry runs it again
        if record is None:
            Path(spec.work_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_json(Path(spec.work_dir) / SPEC_FILE, spec.to_dict())
            # kept on disk so a retry skips this seed; the inner loop's program has written it already (then this
            # writes nothing)
            record = write_final_result(spec.work_dir, ResultRecord.coerce(fn(spec)))
        if not record.ok:
            return dataclasses.replace(record, error=f"seed {k} (seed={seed}): {record.error}")
        records.append(record)
    return _mean_record(records)


def _earlier_attempt(spec: MemberSpec) -> int | None:
    """The attempt that wrote this seed's result, when it was an earlier one than ``spec``'s: that result is moved
    aside (result.attempt<k>.json, as the runner does for a member), so a retry of the member retries the seed."""
    try:
        written_by = int(json.loads((Path(spec.work_dir) / SPEC_FILE).read_text()).get("attempt", 0))
    except (OSError, ValueError, AttributeError):
        return None
    if written_by >= spec.attempt:
        return None
    os.replace(Path(spec.work_dir) / RESULT_FILE, Path(spec.work_dir) / archived_result_name(written_by))
    logger.info("%s: seed failed on attempt %d; attempt %d runs it again", spec.work_dir, written_by, spec.attempt)
    return written_by


def _mean_record(records: list[ResultRecord]) -> ResultRecord:
    """Fitness and response length averaged over the seeds; each seed's fitness kept in the diagnostics."""
    diagnostics: dict[str, float] = {f"seed_fitness_{k}": r.fitness for k, r in enumerate(records)}
    shared = set.intersection(*(set(r.diagnostics) for r in records))
    diagnostics.update({key: statistics.fmean(r.diagnostics[key] for r in records) for key in shared})
    return ResultRecord(
        status="ok", fitness=statistics.fmean(r.fitness for r in records), val_size=records[0].val_size,
        mean_response_tokens=statistics.fmean(r.mean_response_tokens for r in records), diagnostics=diagnostics,
        wall_time_s=sum(r.wall_time_s for r in records), steps_done=sum(r.steps_done for r in records),
        disk_peak_bytes=max((r.disk_peak_bytes for r in records if r.disk_peak_bytes is not None), default=None),
        eval_split=records[0].eval_split,
    )
