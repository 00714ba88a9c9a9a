"""``python -m results.compare DIR... [--out DIR] [--baseline kl]``: the paper-style table over single runs.

One row per (method, task, split, config): mean +- std of pass@1 over seeds on the split the runs were scored on
(validation, or test for runs started with ``eval_split=test``; never mixed in one row), mean response length and its
relative change against the baseline method (KL) on the same task, the seeds used, and provenance (config
hash, code versions, data hashes). Runs that failed, are missing a result or cannot be read are listed, never
averaged in silently. Writes ``comparison.md`` and ``comparison.csv`` (and ``comparison_runs.csv``, one row per
run) to ``--out`` (default: the common parent of the DIRs).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from results.store.atomic import atomic_write_text
from results.report.single_runs import Scan, find_run_dirs

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "method", "task", "split", "n_seeds", "seeds", "pass1_mean", "pass1_std", "response_tokens_mean",
    "response_tokens_rel_change", "n_failed", "config_hash", "code_versions", "data_hashes",
]


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per (method, task, split, config), TABLE_COLUMNS
    runs: pd.DataFrame  # one row per run dir found
    problems: pd.DataFrame  # runs not in the averages: failed / missing / unreadable / no provenance
    skipped: list[tuple[str, str]]
    notes: list[str]


def _join(values: Sequence[object]) -> str:
    return ",".join(str(v) for v in sorted({v for v in values if v not in (None, "")}, key=str))


def _labels(runs: pd.DataFrame) -> pd.Series:
    """``method``, or ``method[config_hash]`` where one method appears with several configs on a task's split."""
    n_configs = runs.groupby(["method", "task", "split"])["config_hash"].transform("nunique")
    return runs["method"].where(n_configs <= 1, runs["method"] + "[" + runs["config_hash"].str[:8] + "]")


def compare(dirs: Sequence[str | Path], baseline: str = "kl") -> Comparison:
    """Scan ``dirs`` for single runs and build the comparison (pure: writes nothing)."""
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
    for (task, split), group in table.groupby(["task", "split"]):
        base = group[group["method"] == baseline]
        if len(base) != 1 or not (base["response_tokens_mean"].iloc[0] > 0):
            what = "no" if base.empty else ("several" if len(base) > 1 else "no usable")
            notes.append(f"task {task} ({split} split): {what} {baseline!r} baseline row; relative length change "
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
    return Comparison(table, runs, problems, scan.skipped, notes)


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
    ]
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="single-run dirs or folders holding them (e.g. a multirun dir)")
    parser.add_argument("--out", default=None, help="where to write comparison.md/.csv (default: common parent)")
    parser.add_argument("--baseline", default="kl", help="method the response length is compared against")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    missing = [d for d in args.dirs if not Path(d).is_dir()]
    if missing:
        sys.stderr.write(f"error: not a directory: {', '.join(missing)} (pass run dirs or their parent folder)\n")
        return 2
    result = compare(args.dirs, baseline=args.baseline)
    if result.runs.empty:
        sys.stderr.write(f"error: no single-run directories (with manifest.json or result.json) under "
                         f"{', '.join(args.dirs)}\n")
        return 2
    out = args.out or os.path.commonpath([str(Path(d).resolve()) for d in args.dirs])
    sys.stdout.write(to_markdown(result))
    for path in write_outputs(result, out):
        sys.stdout.write(f"wrote {path}\n")
    return 0
