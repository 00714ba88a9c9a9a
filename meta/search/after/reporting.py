"""Stage B of the re-evaluation: the exported init and every baseline retrained on fresh reporting seeds.

These seeds are used for nothing else (not the search, not the selection stage), and every row trains on the
same ones, so the rows are paired. Each run is scored on validation, on the test split and on every transfer task
from the same trained model (inner ``extra_evaluations``). The result table is built from the runs' own records
(results/report/search/result_table.py).

Resumable like a generation: rows.json (every row's divergence, params and inner config) is written before
anything is submitted, jobs.json after each submission, member outcomes are files, and the table is written last.
Rows made for another exported init, other baselines, seeds or transfer tasks are moved aside whole.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Sequence

from inner_loop.loss.divergences import length_reference
from launch.base import Launcher
from meta.search.after.baselines import EXPORTED, ReportRow, build_rows, verdict_roles
from meta.search.config import ConfigError
from meta.settings.reevaluate import ReevaluateConfig
from meta.settings.schema import SearchSchema
from meta.search.after.phase import run_phase
from core.seeding import member_seed
from meta.search.staging import staged_inner
from meta.settings.upgrade import stored_manifest
from results.report.search.result_table import build_table, write_table_files
from results.store.layout import member_dir_name
from core.records import MemberSpec
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)

#: the ``generation`` number reporting members carry (job names, logs), apart from the selection stage's 9998
REPORT_GENERATION = 9997
SEED_PURPOSE = "report"


def reporting_seeds(seed: int, count: int) -> list[int]:
    """The reporting seeds: derived from the run seed under their own purpose, so no search or selection run
    shares one."""
    return [member_seed(seed, SEED_PURPOSE, s) for s in range(count)]


def _wanted(settings: ReevaluateConfig, exported: dict[str, Any]) -> dict[str, Any]:
    return {"exported": exported["name"], "exported_params": exported["params"], "seeds": settings.report_seeds,
            "baselines": list(settings.baselines), "transfer": list(settings.transfer), "test": settings.test}


def _rows(cfg: SearchSchema, store: RunStore, overrides: Sequence[str], settings: ReevaluateConfig,
          exported: dict[str, Any]) -> dict[str, Any]:
    """The stored rows when they were made for these settings; otherwise new ones (earlier runs moved aside)."""
    wanted = _wanted(settings, exported)
    existing = store.read_report_rows()
    if existing is not None and all(existing.get(k) == v for k, v in wanted.items()):
        return existing
    if existing is not None or store.reevaluate_dir(reporting=True).exists():
        old = store.archive_reporting()
        logger.info("reporting rows changed (exported init, baselines, seeds or transfer); earlier runs moved to %s",
                    old)
    rows = build_rows(cfg, overrides, exported["params"], settings.baselines, settings.transfer, settings.test,
                      settings.report_seeds)
    # the transfer tasks are composed here by hub name: a staged run's rows read the snapshots its manifest pins
    manifest = stored_manifest(store)
    rows = [dataclasses.replace(row, inner=staged_inner(cfg.inner.entrypoint, row.inner, manifest)) for row in rows]
    record = wanted | {"rows": [row.to_dict() for row in rows]}
    store.write_report_rows(record)
    return record


def _specs(cfg: SearchSchema, store: RunStore, run_id: str, rows: Sequence[dict[str, Any]],
           seeds: Sequence[int]) -> list[MemberSpec]:
    """Member ``r * len(seeds) + s`` trains row r with reporting seed s (the same seed for every row: paired); a row
    with a map per seed (radius_random) trains map s with seed s."""
    folder = store.reevaluate_dir(reporting=True)
    specs = []
    for r, row in enumerate(rows):
        per_seed = row.get("params_per_seed")
        for s, seed in enumerate(seeds):
            index = r * len(seeds) + s
            specs.append(MemberSpec(run_id=run_id, generation=REPORT_GENERATION, index=index, seed=seed,
                                    params=list(per_seed[s] if per_seed else row["params"] or []),
                                    work_dir=str(folder / member_dir_name(index)), inner=row["inner"]))
    return specs


def run_reporting(cfg: SearchSchema, store: RunStore, launcher: Launcher, run_id: str, overrides: Sequence[str],
                  exported: dict[str, Any], settings: ReevaluateConfig) -> dict[str, Any]:
    """Train (resuming) every row on the reporting seeds, write the result table (JSON, markdown, CSV, plot) and
    return its data. ``exported``: the selection stage's choice (name, params)."""
    record = _rows(cfg, store, overrides, settings, exported)
    rows = record["rows"]
    seeds = reporting_seeds(cfg.seed, settings.report_seeds)
    logger.info("reporting: %d rows (%s) x %d fresh seeds", len(rows), ", ".join(r["name"] for r in rows), len(seeds))
    records = run_phase(cfg, launcher, store.reevaluate_dir(reporting=True), _specs(cfg, store, run_id, rows, seeds),
                        "reporting stage")
    table_rows = []
    for r, row in enumerate(rows):
        runs = [records[r * len(seeds) + s].to_dict() for s in range(len(seeds))]
        table_rows.append({key: row[key] for key in ("name", "label", "divergence", "coef_source")} | {"runs": runs})
    baselines = [row["name"] for row in rows if row["name"] != EXPORTED]
    table = build_table(table_rows, seeds, baselines, EXPORTED, verdict_roles(baselines),
                        length_reference=length_reference())
    table["exported"] = exported["name"]
    store.write_result_table(table)
    paths = write_table_files(table, store.reevaluate_dir(reporting=True))
    logger.info("result table written: %s", ", ".join(str(p) for p in paths.values()))
    for sentence in table["verdict"]:
        logger.info("verdict: %s", sentence)
    return table


def plan_rows(cfg: SearchSchema, overrides: Sequence[str]) -> list[ReportRow]:
    """The reporting rows as a dry run shows them (the exported init is not known before the search)."""
    settings = cfg.reevaluate_settings
    return build_rows(cfg, overrides, None, settings.baselines, settings.transfer, settings.test,
                      settings.report_seeds)


def has_result_table(cfg: SearchSchema) -> bool:
    """The search ends with a result table (reevaluate.top_k and reevaluate.report_seeds both above 0)."""
    settings = cfg.reevaluate_settings
    return settings.top_k > 0 and settings.report_seeds > 0


def check_rows(cfg: SearchSchema, rows: Sequence[ReportRow]) -> None:
    """Every reporting row's inner config through the member program's own check, before the search submits
    anything (a bad transfer task or baseline must not surface after days of search). ConfigError naming the row."""
    from launch.member import load_program

    program = load_program(cfg.inner.entrypoint)
    checked: set[str] = set()
    for row in rows:
        config = json.dumps(row.inner, sort_keys=True, default=str)
        if config in checked:  # another row trains this very config (on its own seeds): checked once
            continue
        checked.add(config)
        try:
            program.validate(row.inner)
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigError(f"reevaluate: the result table's row {row.name!r} ({row.label}) would fail: {exc}") from None
