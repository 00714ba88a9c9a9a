"""``python -m results.compare DIR... [--out DIR] [--baseline METHOD]``: the paper-style table over single runs.

One row per (method, task, split, config): mean +- std of pass@1 over seeds on the split the runs were scored on
(validation, or test for runs started with ``eval_split=test``; never mixed in one row), mean response length and its
relative change against the baseline method on the same task (the divergence registry's length reference, KL, as
each run's manifest records it; ``--baseline`` names another), the seeds used, and provenance (config
hash, code versions, data hashes). Runs that failed, are missing a result or cannot be read are listed, never
averaged in silently. Writes ``comparison.md`` and ``comparison.csv`` (and ``comparison_runs.csv``, one row per
run) to ``--out`` (default: the common parent of the DIRs).

The finished runs' other test numbers get a second table, ``comparison_evaluations.csv``: one row per (method,
trained task, config, evaluated task, source), mean +- std of pass@1 over seeds, where source is ``in-run`` (a
record's ``evaluations``: the inner config's extra_evaluations) or ``afterwards`` (an evaluation file written by
``python -m inner_loop.evaluate``; one row per task node used, since a node decides the problems).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from results.report.arguments import check_output_folder, run_dir_argument
from results.store.atomic import atomic_write_text
from results.store.layout import RESULT_FILE, parse_evaluation_file_name
from results.store.provenance import config_hash
from core.records import ResultRecord
from results.report.single_runs import Scan, find_run_dirs

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "method", "task", "split", "n_seeds", "seeds", "pass1_mean", "pass1_std", "response_tokens_mean",
    "response_tokens_rel_change", "n_failed", "config_hash", "code_versions", "data_hashes",
]

EVALUATION_COLUMNS = [
    "method", "task", "evaluated_on", "split", "source", "n_seeds", "seeds", "pass1_mean", "pass1_std",
    "response_tokens_mean", "problems", "config_hash", "eval_config",
]
IN_RUN, AFTERWARDS = "in-run", "afterwards"


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per (method, task, split, config), TABLE_COLUMNS
    runs: pd.DataFrame  # one row per run dir found
    problems: pd.DataFrame  # runs not in the averages: failed / missing / unreadable / no provenance
    skipped: list[tuple[str, str]]
    notes: list[str]
    #: the ok runs' other test numbers (in-run extra evaluations, evaluation files), EVALUATION_COLUMNS
    evaluations: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVALUATION_COLUMNS))


def _join(values: Sequence[object]) -> str:
    return ",".join(str(v) for v in sorted({v for v in values if v not in (None, "")}, key=str))


def _labels(runs: pd.DataFrame) -> pd.Series:
    """``method``, or ``method[config_hash]`` where one method appears with several configs on a task's split."""
    n_configs = runs.groupby(["method", "task", "split"])["config_hash"].transform("nunique")
    return runs["method"].where(n_configs <= 1, runs["method"] + "[" + runs["config_hash"].str[:8] + "]")


def _entry(source: str, entry: Any, eval_config: str) -> dict[str, Any] | None:
    """One evaluation of a run as a row, or None when it lacks a finite pass@1 (said in a note by the caller)."""
    if not isinstance(entry, dict):
        return None
    value = entry.get("pass_at_1")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    tokens = entry.get("mean_response_tokens")
    return {"source": source, "evaluated_on": str(entry.get("task", "?")), "split": str(entry.get("split", "?")),
            "pass_at_1": float(value), "size": entry.get("size"), "eval_config": eval_config,
            "tokens": float(tokens) if isinstance(tokens, (int, float)) else float("nan")}


def _run_evaluations(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """The evaluations of one ok run: its record's (in-run) and its evaluation files' (afterwards)."""
    rows = []
    try:
        record = ResultRecord.from_dict(json.loads((path / RESULT_FILE).read_text()))
        in_run = record.evaluations
    except (OSError, ValueError, TypeError):
        in_run = {}  # the run row already says the record is unreadable
    for name, entry in sorted(in_run.items()):
        row = _entry(IN_RUN, entry, "")
        if row is None:
            notes.append(f"{path}: evaluation {name!r} in {RESULT_FILE} has no pass@1; left out")
        else:
            rows.append(row)
    for file in sorted(path.iterdir()):
        if parse_evaluation_file_name(file.name) is None:
            continue
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            notes.append(f"{file}: unreadable ({exc}); left out")
            continue
        node = data.get("task_config") if isinstance(data, dict) else None
        row = _entry(AFTERWARDS, data, config_hash(node)[:8] if isinstance(node, dict) else "?")
        if row is None:
            notes.append(f"{file}: no pass@1; left out")
        else:
            rows.append(row)
    return rows


def _evaluations(runs: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """EVALUATION_COLUMNS over the ok runs: mean +- std of each evaluation over seeds."""
    found = []
    for run in runs[runs["state"] == "ok"].itertuples(index=False):
        for row in _run_evaluations(Path(run.path), notes):
            found.append({**row, "method": run.label, "task": run.task, "seed": run.seed,
                          "config_hash": run.config_hash})
    if not found:
        return pd.DataFrame(columns=EVALUATION_COLUMNS)
    table = []
    keys = ["method", "task", "evaluated_on", "split", "source", "config_hash", "eval_config"]
    for key, group in pd.DataFrame(found).groupby(keys, sort=True):
        seeds = group["seed"].dropna().astype(int).tolist()
        table.append({**dict(zip(keys, key)), "n_seeds": len(group), "seeds": _join(seeds),
                      "pass1_mean": group["pass_at_1"].mean(),
                      "pass1_std": group["pass_at_1"].std(ddof=1) if len(group) > 1 else float("nan"),
                      "response_tokens_mean": group["tokens"].mean(), "problems": _join(group["size"].tolist())})
    return pd.DataFrame(table, columns=EVALUATION_COLUMNS)


def compare(dirs: Sequence[str | Path], baseline: str | None = None) -> Comparison:
    """Scan ``dirs`` for single runs and build the comparison (pure: writes nothing). ``baseline``: the method
    response lengths are compared with; None: the one whose runs' manifests mark it as the divergence registry's
    length reference."""
    scan: Scan = find_run_dirs(dirs)
    runs = pd.DataFrame([asdict(r) for r in scan.rows]).drop(columns=["extra"], errors="ignore")
    notes: list[str] = []
    if runs.empty:
        empty = pd.DataFrame(columns=TABLE_COLUMNS)
        return Comparison(empty, runs, runs, scan.skipped, ["no single-run directories found"])
    runs["label"] = _labels(runs)
    known = runs[runs["method"] != "unknown"]
    ok = known[known["state"] == "ok"]
    problems = runs[runs["state"] != "ok"].copy()
    rows = []
    for (label, task, split, chash), group in known.groupby(["label", "task", "split", "config_hash"], sort=True):
        good = group[group["state"] == "ok"]
        seeds = good["seed"].dropna().astype(int).tolist()
        duplicated = sorted({s for s in seeds if seeds.count(s) > 1})
        if duplicated:
            notes.append(f"{label}/{task}: seed(s) {duplicated} appear in more than one run dir; all are averaged")
        rows.append({
            "method": label,
            "task": task,
            "split": split or "?",
            "n_seeds": len(good),
            "seeds": _join(seeds),
            "pass1_mean": good["fitness"].mean() if len(good) else float("nan"),
            "pass1_std": good["fitness"].std(ddof=1) if len(good) > 1 else float("nan"),
            "response_tokens_mean": good["mean_response_tokens"].mean() if len(good) else float("nan"),
            "response_tokens_rel_change": float("nan"),
            "n_failed": int((group["state"] != "ok").sum()),
            "config_hash": chash,
            "code_versions": _join(group["code_version"].tolist()),
            "data_hashes": _join(group["data_hash"].tolist()),
        })
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    flagged = set(known.loc[known["length_reference"], "label"])
    for (task, split), group in table.groupby(["task", "split"]):
        base = group[group["method"].isin(flagged) if baseline is None else group["method"] == baseline]
        if len(base) != 1 or not (base["response_tokens_mean"].iloc[0] > 0):
            what = "no" if base.empty else ("several" if len(base) > 1 else "no usable")
            named = ("length-reference (the divergence registry's; runs recorded before it: pass --baseline)"
                     if baseline is None else repr(baseline))
            notes.append(f"task {task} ({split} split): {what} {named} baseline row; relative length change "
                         "left empty")
            continue
        ref = float(base["response_tokens_mean"].iloc[0])
        table.loc[group.index, "response_tokens_rel_change"] = (group["response_tokens_mean"] - ref) / ref
    for task, group in known.groupby("task"):
        if group["data_hash"].nunique() > 1:
            notes.append(f"task {task}: runs used different data ({group['data_hash'].nunique()} data hashes); "
                         "check the data_hashes column before comparing them")
    if len(ok) == 0:
        notes.append("no finished (ok) runs: nothing to average")
    evaluations = _evaluations(known, notes)
    return Comparison(table, runs, problems, scan.skipped, notes, evaluations)


def _pct(mean: float, std: float) -> str:
    if pd.isna(mean):
        return "n/a"
    return f"{100 * mean:.1f}" + ("" if pd.isna(std) else f" ± {100 * std:.1f}")


def to_markdown(result: Comparison) -> str:
    """The table as GitHub markdown, then failed / missing runs, skipped dirs and notes."""
    lines = ["| method | task | split | pass@1 (%) | response tokens | Δ length vs KL | seeds | failed | config | code | "
             "data |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result.table.itertuples(index=False):
        tokens = "n/a" if pd.isna(row.response_tokens_mean) else f"{row.response_tokens_mean:.1f}"
        rel = "" if pd.isna(row.response_tokens_rel_change) else f"{100 * row.response_tokens_rel_change:+.1f}%"
        lines.append(
            f"| {row.method} | {row.task} | {row.split} | {_pct(row.pass1_mean, row.pass1_std)} | {tokens} | {rel} | "
            f"{row.n_seeds} ({row.seeds}) | {row.n_failed} | {row.config_hash} | {row.code_versions} | "
            f"{row.data_hashes} |"
        )
    if len(result.evaluations):
        lines += ["", "Other test numbers of the finished runs (greedy pass@1; in-run: the run's extra_evaluations, "
                      "afterwards: python -m inner_loop.evaluate):", "",
                  "| method | trained on | evaluated on | split | source | pass@1 (%) | response tokens | problems | "
                  "seeds | config | eval config |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in result.evaluations.itertuples(index=False):
            tokens = "n/a" if pd.isna(row.response_tokens_mean) else f"{row.response_tokens_mean:.1f}"
            lines.append(
                f"| {row.method} | {row.task} | {row.evaluated_on} | {row.split} | {row.source} | "
                f"{_pct(row.pass1_mean, row.pass1_std)} | {tokens} | {row.problems} | {row.n_seeds} ({row.seeds}) | "
                f"{row.config_hash} | {row.eval_config} |"
            )
    if len(result.problems):
        lines += ["", f"Runs not in the averages ({len(result.problems)}):", ""]
        for row in result.problems.itertuples(index=False):
            seed = "?" if pd.isna(row.seed) else int(row.seed)
            lines.append(f"- {row.state}: {row.method}/{row.task} seed {seed} in {row.path}: {row.error}")
    if result.skipped:
        lines += ["", "Skipped directories:", ""] + [f"- {p}: {why}" for p, why in result.skipped]
    if result.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def write_outputs(result: Comparison, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    paths = [
        atomic_write_text(out / "comparison.md", to_markdown(result)),
        atomic_write_text(out / "comparison.csv", result.table.to_csv(index=False)),
        atomic_write_text(out / "comparison_runs.csv", result.runs.to_csv(index=False)),
        atomic_write_text(out / "comparison_evaluations.csv", result.evaluations.to_csv(index=False)),
    ]
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=run_dir_argument,
                        help="single-run dirs or folders holding them (e.g. a multirun dir): paths or run_dir=<path>")
    parser.add_argument("--out", default=None, help="where to write comparison.md/.csv (default: common parent)")
    parser.add_argument("--baseline", default=None,
                        help="method the response length is compared against (default: the divergence the registry "
                             "declares the length reference, as the runs recorded it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    missing = [d for d in args.dirs if not Path(d).is_dir()]
    if missing:
        sys.stderr.write(f"error: not a directory: {', '.join(missing)} (pass run dirs or their parent folder)\n")
        return 2
    try:
        check_output_folder(args.out)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    result = compare(args.dirs, baseline=args.baseline)
    if result.runs.empty:
        why = "".join(f"\n  {path}: {reason}" for path, reason in result.skipped[:10])
        more = f"\n  ... and {len(result.skipped) - 10} more" if len(result.skipped) > 10 else ""
        sys.stderr.write(f"error: no single runs of python -m inner_loop.run under {', '.join(args.dirs)}"
                         + (f"; left out:{why}{more}" if why else " (none holds a result.json)") + "\n")
        return 2
    out = args.out or os.path.commonpath([str(Path(d).resolve()) for d in args.dirs])
    sys.stdout.write(to_markdown(result))
    for path in write_outputs(result, out):
        sys.stdout.write(f"wrote {path}\n")
    return 0
