"""``python -m results.report RUN_DIR [--out DIR] [--top K]``: tables and plots of an ES search, live or finished.

A ``meta.tune`` run dir (one with a study.json) gets the tuning report instead (results/report/tune.py).

Prints the generations table, disk use per generation and the top members, then writes CSV tables (with
provenance columns: run id, config hash, code version, seed, data hashes) and four PNG plots to ``--out``
(default ``RUN_DIR/report``).
Works while the search is running and on a partly corrupt run dir; everything it could not read is listed.
Exit status: 0 written, 2 RUN_DIR is not a run dir.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from results.store.atomic import atomic_write_text, CorruptFileError
from results.store.layout import REPORT_DIR
from results.report.arguments import check_output_folder, run_dir_argument
from results.report.paired import pooled_std
from results.report.search.online import SearchMeasure, search_measure
from results.report.search.plots import (plot_disk, plot_failures, plot_fitness,
                                         plot_fitness_vs_control, plot_response_length)
from results.store.run_store import RunStore
from core.config.horizon import horizon_text
from results.report.search.snapshot import RunSnapshot, load_run
from results.store.study_store import read_study_file
from results.report.tune import build_tune_report, format_tune_report
from results.report.search.result_table import render_markdown, table_file_paths

logger = logging.getLogger(__name__)

PROVENANCE_COLUMNS = ["run_id", "config_hash", "code_version", "seed", "data_hashes"]
#: Generation columns in bytes; the CSV keeps the numbers, the text shows them in their own section with units.
DISK_COLUMNS = ["disk_peak_max", "disk_peak_mean", "disk_peak_sum"]
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@dataclass
class Report:
    snapshot: RunSnapshot
    generations: pd.DataFrame
    top: pd.DataFrame
    provenance: dict[str, str]
    files: list[Path]
    #: what a member's fitness measures (an online search's: results/report/search/online.py ParticleRuns)
    measure: SearchMeasure = field(default_factory=SearchMeasure)


def provenance_of(snapshot: RunSnapshot) -> dict[str, str]:
    """The provenance fields every table carries; ``unknown`` where the run dir does not say."""
    manifest = snapshot.manifest
    return {
        "run_id": str(manifest.get("run_id", "unknown")),
        "config_hash": str(manifest.get("config_hash", "unknown")),
        "code_version": str(manifest.get("code_version", "unknown")),
        "seed": str(manifest.get("seed", "unknown")),
        "data_hashes": ";".join(snapshot.data_hashes) or "unknown",
    }


def _with_provenance(table: pd.DataFrame, provenance: dict[str, str]) -> pd.DataFrame:
    out = table.copy()
    for column in PROVENANCE_COLUMNS:
        out[column] = provenance[column]
    return out


def build_report(run_dir: str | Path, out_dir: str | Path | None = None, top_k: int = 10) -> Report:
    """Read ``run_dir`` and write the tables and plots; ValueError if it is not a run dir."""
    snapshot = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else snapshot.root / REPORT_DIR
    provenance = provenance_of(snapshot)
    measure = search_measure(RunStore(snapshot.root))
    # an online search's best members: the best end scores of particle runs, never a truncation's change
    top = measure.top(snapshot.members, top_k)
    files = [
        atomic_write_text(out / "generations.csv",
                          _with_provenance(snapshot.generations, provenance).to_csv(index=False)),
        atomic_write_text(out / "members.csv", _with_provenance(snapshot.members, provenance).to_csv(index=False)),
        atomic_write_text(out / "top_members.csv", _with_provenance(top, provenance).to_csv(index=False)),
        atomic_write_text(out / "skipped.txt", "".join(f"{line}\n" for line in snapshot.skipped)),
        plot_fitness(snapshot.generations, snapshot.members, out / "fitness.png", measure.label),
        plot_response_length(snapshot.generations, out / "response_length.png"),
        plot_failures(snapshot.generations, out / "failures.png"),
        plot_disk(snapshot.generations, out / "disk.png"),
        plot_fitness_vs_control(snapshot.members, out / "fitness_vs_control.png"),
        *measure.extra_plots(snapshot.members, out),
    ]
    return Report(snapshot, snapshot.generations, top, provenance, files, measure)


def format_bytes(count: float | None) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units); ``n/a`` for an unknown (None / NaN) size."""
    if count is None or pd.isna(count):
        return "n/a"
    value, unit = float(count), _UNITS[0]
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def format_disk(generations: pd.DataFrame, members: pd.DataFrame) -> list[str]:
    """One line per generation: peak disk per member (max / mean) and the sum over the generation."""
    lines = []
    for row in generations.to_dict("records"):
        group = members[members["generation"] == row["generation"]] if len(members) else members
        measured = int(group["disk_peak_bytes"].notna().sum()) if len(group) else 0
        lines.append(f"  gen {int(row['generation'])}: per member max {format_bytes(row['disk_peak_max'])}, "
                     f"mean {format_bytes(row['disk_peak_mean'])}; generation sum "
                     f"{format_bytes(row['disk_peak_sum'])} ({measured}/{len(group)} members measured)")
    return lines or ["  (none yet)"]


def _fmt(value: object, digits: int = 4) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{float(value):.{digits}f}"


def _stored_config(root: Path) -> dict:
    """The run's stored config ({} when it cannot be read)."""
    import yaml

    try:
        return yaml.safe_load(RunStore(root).read_config_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _population(root: Path) -> int:
    """The run's population (0 without a readable config)."""
    return int(_stored_config(root).get("population") or 0)


def _seeds_per_member(root: Path) -> int:
    """The run's seeds_per_member (1 for runs from before the setting, or without a readable config)."""
    return int(_stored_config(root).get("seeds_per_member") or 1)


def _reporting_noise(root: Path, selection: dict) -> tuple[float, str] | None:
    """One init's seed noise pooled over the selection's runs and the result table's rows of the search's own
    divergence (the exported init, the start centre, the random init: each on the reporting seeds). Why: the
    selection alone gives a few inits x 2 seeds, a std on ~3 degrees of freedom that can read 0.01 where the
    reporting seeds of the same inits spread by 0.09, and a ratio divided by it then claims signal that is noise."""
    try:
        table = RunStore(root).read_result_table()
    except CorruptFileError:
        return None
    if not table or not table.get("rows"):
        return None
    own = table["rows"][0].get("divergence")  # the exported init's row comes first
    groups = [list(row["metrics"]["validation"]["values"].values()) for row in table["rows"]
              if row.get("divergence") == own and row.get("metrics", {}).get("validation")]
    selection_groups = [c.get("values") or [] for c in selection["candidates"]]
    pooled = pooled_std(groups + selection_groups)
    if pooled is None:
        return None
    dof = sum(len(g) - 1 for g in groups + selection_groups if len(g) > 1)
    return pooled, (f"  one init over seeds (with the result table's {len(groups)} {own} rows x their reporting seeds, "
                    f"{sum(len(g) for g in groups)} runs; {dof} degrees of freedom in all): std {_fmt(pooled)}; the "
                    "ratio below uses this")


def format_noise(snapshot: RunSnapshot, measure: SearchMeasure | None = None) -> list[str]:
    """Whether the search sees signal: the spread across a generation's members next to the spread of ONE init
    over seeds (the re-evaluation's, pooled over its inits) and the control member's drift between generations.
    ``measure`` (read from the run dir when not given): an online search's members are truncations, whose spread (of
    changes over a piece of a run) is not comparable with one init's over whole runs, so no ratio is drawn."""
    measure = measure if measure is not None else search_measure(RunStore(snapshot.root))
    gens = snapshot.generations
    spread = gens["std_fitness"].dropna() if len(gens) else pd.Series(dtype=float)
    control = gens["control_fitness"].dropna() if len(gens) and "control_fitness" in gens else pd.Series(dtype=float)
    seeds = _seeds_per_member(snapshot.root)
    lines = [
        f"  across members (std of {measure.spread_words} within a "
        f"generation): median {_fmt(spread.median() if len(spread) else None)}"
        f" over {len(spread)} generation(s)" + (f"; each member the mean of {seeds} seeds" if seeds > 1 else ""),
        f"  control (the centre, generation's seed): {', '.join(_fmt(v, 3) for v in control) or 'none yet'}"
        + (f"; std across generations {_fmt(control.std(ddof=1))} (seed-to-seed drift + the centre's moves)"
           if len(control) > 1 else ""),
    ]
    try:
        summary = RunStore(snapshot.root).read_reevaluation()
    except CorruptFileError as exc:
        return lines + [f"  re-evaluation unreadable: {exc}"]
    if summary is None:
        return lines + ["  one init over seeds: no re-evaluation yet (python -m meta.reevaluate run_dir=...)"]
    floor = summary.get("noise_floor_std")
    runs = sum(c["n"] for c in summary["candidates"])
    lines.append(f"  one init over seeds (re-evaluation, pooled over {len(summary['candidates'])} inits, {runs} runs): "
                 f"std {_fmt(floor)}")
    reporting = _reporting_noise(snapshot.root, summary)
    if reporting is not None:
        floor, line = reporting
        lines.append(line)
    if floor and len(spread) and measure.ratio_drawn:
        # a member's fitness is the mean of `seeds` runs: its own noise is one run's divided by sqrt(seeds)
        member_noise = floor / seeds ** 0.5
        lines.append(f"  ratio across-members / one-init: {spread.median() / member_noise:.2f} (near 1 or below: "
                     "members differ by no more than seed noise, so their ranking is mostly noise"
                     + (f"; one-init noise of a {seeds}-seed mean: {_fmt(member_noise)}" if seeds > 1 else "") + ")")
    nominated = f"; members nominated by {summary['nominated_by']}" if summary.get("nominated_by") else ""
    lines.append(f"  selection stage, {summary['seeds']} fresh seeds each (search fitness -> mean +- std (n), "
                 f"lower bound{nominated}):")
    for c in summary["candidates"]:
        mark = "  <- exported" if c["name"] == summary["chosen"] else ""
        lines.append(f"    {c['name']}: {_fmt(c['search_fitness'])} -> {_fmt(c['mean'])} +- {_fmt(c['std'])} "
                     f"(n={c['n']}, failed {c['failed']}), {_fmt(c.get('lower_bound'))}{mark}")
    return lines


def format_result_table(root: Path) -> list[str]:
    """The reporting stage's result table (markdown), or how to get one."""
    try:
        table = RunStore(root).read_result_table()
    except CorruptFileError as exc:
        return [f"result table unreadable: {exc}"]
    if table is None:
        return ["no result table yet (the reporting stage of `python -m meta.reevaluate run_dir=...` writes it)"]
    folder = RunStore(root).result_table_path.parent
    files = [f"  {path}" for path in table_file_paths(folder).values() if path.is_file()]
    return [f"Result table ({len(table['seeds'])} reporting seeds, paired, used for nothing else):", "",
            render_markdown(table), "", "the result table's files (written by the reporting stage):", *files]


def format_verdict(root: Path) -> list[str]:
    """The result table's verdict sentences, to end the report with (none before the table exists)."""
    try:
        table = RunStore(root).read_result_table()
    except CorruptFileError:
        return []
    sentences = (table or {}).get("verdict") or []
    return ["", "verdict (the result table's, validation pass@1):", *sentences] if sentences else []


def format_report(report: Report) -> str:
    """Human-readable text: provenance, generations table, disk per generation, top members, skipped files."""
    p = report.provenance
    gens = report.generations.drop(columns=[c for c in DISK_COLUMNS if c in report.generations.columns])
    top = report.top.copy()
    if "disk_peak_bytes" in top.columns:
        top = top.assign(disk_peak_bytes=top["disk_peak_bytes"].map(format_bytes)).rename(
            columns={"disk_peak_bytes": "disk_peak"})
    measure = report.measure
    lines = [
        f"run {report.snapshot.root}  (run_id {p['run_id']}, seed {p['seed']})",
        f"config hash {p['config_hash']}  code {p['code_version']}  data {p['data_hashes']}",
        *([horizon] if (horizon := horizon_text(_stored_config(report.snapshot.root))) else []),
        "",
        "generations:",
        f"  (a member's fitness: {measure.label})",
        gens.to_string(index=False, float_format=lambda x: f"{x:.4g}") if len(gens) else "  (none yet)",
        *(["", *progress] if (progress := measure.progress_lines(report.snapshot.members,
                                                                   _population(report.snapshot.root))) else []),
        "",
        "disk (peak size of a member's work dir, checkpoints included):",
        *format_disk(report.generations, report.snapshot.members),
        "",
        measure.top_title(len(top)),
        top.to_string(index=False, float_format=lambda x: f"{x:.4g}") if len(top) else "  (none yet)",
        "",
        "noise (validation pass@1):",
        *format_noise(report.snapshot, measure),
        "",
        *format_result_table(report.snapshot.root),
    ]
    if report.snapshot.skipped:
        lines += ["", f"skipped ({len(report.snapshot.skipped)}):"] + [f"  {s}" for s in report.snapshot.skipped]
    lines += ["", "wrote:"] + [f"  {f}" for f in report.files]
    lines += format_verdict(report.snapshot.root)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=run_dir_argument,
                        help="the run_dir of python -m meta.run (may still be running): the path or run_dir=<path>")
    parser.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report)")
    parser.add_argument("--top", type=int, default=10, help="how many top members to list (default 10)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    if args.top < 1:
        sys.stderr.write(f"error: --top must be >= 1, got {args.top}\n")
        return 2
    try:
        check_output_folder(args.out)
        if read_study_file(args.run_dir) is not None:  # a meta.tune run
            sys.stdout.write(format_tune_report(build_tune_report(args.run_dir, args.out)))
            return 0
        report = build_report(args.run_dir, args.out, args.top)
    except ValueError as exc:  # CorruptFileError included
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(format_report(report))
    return 0
