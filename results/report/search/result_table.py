"""The result table of a search, in the paper's terms: every row trained on the same reporting seeds.

Input: the reporting rows, each with its runs (one per reporting seed: status, validation pass@1, mean response
length, and the test / transfer evaluations of the same trained model). Output: per row pass@1 mean, std (the
paper's "training variance": the spread across seeds) and n, test and transfer numbers, response length and its
change relative to KL; and every paired difference (row - baseline) with its 95% t interval and the number of
seeds that would exclude 0 at the observed effect (results/report/paired.py). Rendered as markdown, CSV and a plot.
"""
from __future__ import annotations

import io
import logging
import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from results.report.paired import CONFIDENCE, MAX_SEEDS, mean_interval, paired_difference
from results.store.atomic import atomic_write_bytes, atomic_write_text
from results.store.layout import RESULT_DIFFERENCES_FILE, result_table_file

logger = logging.getLogger(__name__)

#: the metric every run is chosen and compared by; the others are named by their evaluation ("test",
#: "transfer/humaneval")
VALIDATION = "validation"
#: what a baseline row is to the verdict (meta/search/after/baselines.py gives each of its rows one): the search's start, maps
#: drawn at the search's radius with no selection, a regularizer or tuned row compared with, the untrained model
ROLE_START, ROLE_RADIUS, ROLE_COMPARED, ROLE_BASE = "start", "radius", "compared", "base"
#: the order of the verdict's sentences
_ROLE_ORDER = (ROLE_START, ROLE_RADIUS, ROLE_COMPARED, ROLE_BASE)


def _summary(values: Mapping[int, float]) -> dict[str, Any]:
    data = list(values.values())
    interval = mean_interval(data)
    return {
        "mean": statistics.fmean(data) if data else None,
        "std": statistics.stdev(data) if len(data) > 1 else None,
        "n": len(data),
        "low": interval[0] if interval else None,
        "high": interval[1] if interval else None,
        "values": {str(k): v for k, v in sorted(values.items())},
    }


def _metric_values(runs: Sequence[Mapping[str, Any]], metric: str) -> dict[int, float]:
    """Seed index -> value of ``metric`` over the runs that succeeded."""
    values = {}
    for index, run in enumerate(runs):
        if run is None or run.get("status") != "ok":
            continue
        if metric == VALIDATION:
            values[index] = float(run["fitness"])
        else:
            entry = (run.get("evaluations") or {}).get(metric)
            if entry is not None:
                values[index] = float(entry["pass_at_1"])
    return values


def metrics_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """validation, then every other evaluation some run recorded (test first, then transfer tasks, sorted)."""
    names = {name for row in rows for run in row["runs"] if run for name in (run.get("evaluations") or {})}
    return [VALIDATION, *sorted(names, key=lambda n: (n != "test", n))]


def build_table(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int], baselines: Sequence[str],
                first: str | None = None, roles: Mapping[str, str] | None = None,
                length_reference: str | None = None) -> dict[str, Any]:
    """The table's data (JSON-able). ``rows``: dicts with name, label, divergence, coef_source and ``runs`` (one
    per reporting seed, in ``seeds`` order; None for a run that has no record). ``first``: the row the table is
    about (the exported init), whose differences to each baseline are shown first. ``roles``: baseline name ->
    ROLE_*, the comparisons the verdict speaks of (``verdict``). ``length_reference``: the row every row's response
    length is compared with (the divergence registry's ``length_reference``; None: no comparison)."""
    metrics = metrics_of(rows)
    table_rows = []
    for row in rows:
        runs = row["runs"]
        lengths = {i: float(r["mean_response_tokens"]) for i, r in enumerate(runs) if r and r.get("status") == "ok"}
        table_rows.append({
            "name": row["name"], "label": row["label"],
            "divergence": row["divergence"].get("name"), "coef": row["divergence"].get("coef"),
            "coef_source": row["coef_source"],
            "runs": len(runs), "failed": sum(1 for r in runs if not r or r.get("status") != "ok"),
            "metrics": {metric: _summary(_metric_values(runs, metric)) for metric in metrics},
            "response_tokens": statistics.fmean(lengths.values()) if lengths else None,
        })
    reference = next((r for r in table_rows if r["name"] == length_reference), None)
    for row in table_rows:
        ref = reference["response_tokens"] if reference else None
        row["response_tokens_vs_reference"] = (row["response_tokens"] / ref - 1.0
                                        if ref and row["response_tokens"] is not None else None)
    by_name = {row["name"]: row for row in rows}
    differences = []
    for metric in metrics:
        for row in rows:
            for baseline in baselines:
                if baseline == row["name"] or baseline not in by_name:
                    continue
                diff = paired_difference(row["name"], _metric_values(row["runs"], metric), baseline,
                                         _metric_values(by_name[baseline]["runs"], metric))
                differences.append({"metric": metric, **diff.to_dict()})
    table = {"confidence": CONFIDENCE, "seeds": list(seeds), "metrics": metrics, "baselines": list(baselines),
             "first": first, "length_reference": reference["name"] if reference else None, "rows": table_rows, "differences": differences, "roles": dict(roles or {})}
    table["verdict"] = verdict(table)
    return table


# ------------------------------------------------------------------ the verdict
def _difference(table: Mapping[str, Any], row: str, baseline: str) -> Mapping[str, Any] | None:
    return next((d for d in table["differences"] if d["metric"] == VALIDATION and d["row"] == row
                 and d["baseline"] == baseline), None)


def _numbers(diff: Mapping[str, Any], level: int) -> str:
    return (f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}], {diff['n']} paired seeds, "
            f"{level}% t interval")


def _resolve_clause(diff: Mapping[str, Any]) -> str:
    needed = diff["seeds_to_exclude_zero"]
    if needed is not None:
        return f"about {needed} paired seeds would resolve it at the observed spread"
    if diff["mean"] == 0.0:
        return "the observed mean difference is 0, so no number of seeds would resolve it"
    return f"more than {MAX_SEEDS} paired seeds would be needed at the observed spread"


def comparison_sentence(subject: str, what: str, diff: Mapping[str, Any] | None, level: int) -> str:
    """One sentence on ``subject`` minus ``what`` (validation pass@1), read from the paired interval alone."""
    if diff is None or diff["low"] is None:
        n = 0 if diff is None else diff["n"]
        return f"{subject} against {what}: no interval ({n} paired seed(s) finished in both rows)."
    if diff["low"] > 0:
        return f"{subject} beats {what} on validation pass@1: {_numbers(diff, level)}."
    if diff["high"] < 0:
        return f"{subject} is below {what} on validation pass@1: {_numbers(diff, level)}."
    return (f"{subject} against {what}: not resolved at {diff['n']} seeds ({_numbers(diff, level)}); "
            f"{_resolve_clause(diff)}.")


def verdict(table: Mapping[str, Any]) -> list[str]:
    """The sentences a user can copy: one per comparison that matters (the first row against its start, the random
    maps at the search's radius, the regularizers and tuned rows, the untrained model), and where the exported init
    beats its start but not the random-radius maps, that its gain is the radius (the map's scale), not the direction
    the search found. Empty without a first row or roles."""
    first, roles = table.get("first"), table.get("roles") or {}
    if first is None or not roles:
        return []
    level = int(round(table["confidence"] * 100))
    labels = {row["name"]: row["label"] for row in table["rows"]}
    subject = labels.get(first, first)
    ordered = sorted((name for name in table["baselines"] if name in roles),
                     key=lambda name: _ROLE_ORDER.index(roles[name]))
    sentences = [comparison_sentence(subject, labels.get(name, name), _difference(table, first, name), level)
                 for name in ordered]
    start = next((n for n in ordered if roles[n] == ROLE_START), None)
    radius = next((n for n in ordered if roles[n] == ROLE_RADIUS), None)
    over_start = _difference(table, first, start) if start else None
    over_radius = _difference(table, first, radius) if radius else None
    if not (over_start and over_start["low"] is not None and over_start["low"] > 0 and over_radius):
        return sentences
    if over_radius["low"] is not None and over_radius["low"] > 0:
        sentences.append("The gain over the start is more than the search's radius gives: the exported init also "
                         "beats maps drawn at random at that radius, so the search found a direction.")
        return sentences
    radius_gain = _difference(table, radius, start)
    measured = f" (random-radius maps minus the start: {_numbers(radius_gain, level)})" if (
        radius_gain and radius_gain["low"] is not None) else ""
    sentences.append("The gain over the start comes from the radius (the map's scale), not from the direction the "
                     "search found: maps drawn at random at the search's radius, with no selection, are not beaten"
                     f"{measured}.")
    return sentences


# ------------------------------------------------------------------ rendering
def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _mean_std(summary: Mapping[str, Any]) -> str:
    if not summary["n"]:
        return "n/a"
    std = f" ± {_number(summary['std'])}" if summary["std"] is not None else ""
    return f"{_number(summary['mean'])}{std} (n={summary['n']})"


def _interval(diff: Mapping[str, Any]) -> str:
    if diff["low"] is None:
        return f"{_number(diff['mean'])} (n={diff['n']}, no interval)"
    return f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}] (n={diff['n']})"


def _seeds_needed(diff: Mapping[str, Any]) -> str:
    needed = diff["seeds_to_exclude_zero"]
    return "-" if needed is None else str(needed)


def _reference_label(table: Mapping[str, Any]) -> str:
    """The label of the row response lengths are compared with ("no reference" when the table has none)."""
    name = table.get("length_reference")
    return next((row["label"] for row in table["rows"] if row["name"] == name), "no reference")


def render_markdown(table: Mapping[str, Any], all_pairs: bool = True) -> str:
    """The table as markdown: rows, then the paired differences: the first row's against every baseline, then
    (``all_pairs``) every row's against every baseline on validation."""
    first = table.get("first")
    metrics = table["metrics"]
    level = int(round(table["confidence"] * 100))
    head = ["row", "divergence (coef, from)", "validation pass@1 mean ± std (n)",
            *[f"{m} pass@1" for m in metrics[1:]], f"response tokens (vs {_reference_label(table)})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table["rows"]:
        coef = "" if row["coef"] is None else f"{row['coef']:g}, "
        versus = row["response_tokens_vs_reference"]
        length = _number(row["response_tokens"], 2) + ("" if versus is None else f" ({versus:+.1%})")
        cells = [row["label"], f"{row['divergence']} ({coef}{row['coef_source']})",
                 _mean_std(row["metrics"][metrics[0]]), *[_mean_std(row["metrics"][m]) for m in metrics[1:]], length]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"std: the spread across the {len(table['seeds'])} reporting seeds (training variance). "
              f"Differences: paired over the seeds both rows finished, {level}% Student t interval; "
              "'seeds to exclude 0': how many paired seeds the interval would need at the observed mean and std."]
    labels = {row["name"]: row["label"] for row in table["rows"]}
    diffs = table["differences"]
    if first is not None:
        lines += ["", f"**{labels.get(first, first)} minus each baseline**", "",
                  "| baseline | " + " | ".join(f"{m} difference [{level}% CI]" for m in metrics)
                  + " | verdict (validation) | seeds to exclude 0 |", "|" + "---|" * (len(metrics) + 3)]
        for baseline in table["baselines"]:
            found = {d["metric"]: d for d in diffs if d["row"] == first and d["baseline"] == baseline}
            if not found:
                continue
            val = found.get(VALIDATION)
            cells = [labels.get(baseline, baseline), *[_interval(found[m]) if m in found else "n/a" for m in metrics],
                     val["verdict"] if val else "n/a", _seeds_needed(val) if val else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    sentences = table.get("verdict") or []
    if sentences:
        lines += ["", "**Verdict** (validation pass@1, from the intervals above)", "", *sentences]
    if not all_pairs:
        return "\n".join(lines) + "\n"
    lines += ["", f"**Every row minus each baseline (validation pass@1, {level}% CI)**", "",
              "| row | baseline | difference [CI] | verdict | seeds to exclude 0 |", "|---|---|---|---|---|"]
    for d in diffs:
        if d["metric"] == VALIDATION:
            lines.append(f"| {labels.get(d['row'], d['row'])} | {labels.get(d['baseline'], d['baseline'])} | "
                         f"{_interval(d)} | {d['verdict']} | {_seeds_needed(d)} |")
    if sentences:
        lines += ["", "**Verdict**", "", *sentences]
    return "\n".join(lines) + "\n"


def table_frames(table: Mapping[str, Any]) -> tuple[Any, Any]:
    """(rows, differences) as pandas DataFrames, one column per number (the CSV files)."""
    import pandas as pd

    records = []
    for row in table["rows"]:
        record = {k: row[k] for k in ("name", "label", "divergence", "coef", "coef_source", "runs", "failed",
                                      "response_tokens", "response_tokens_vs_reference")}
        for metric, summary in row["metrics"].items():
            for key in ("mean", "std", "n", "low", "high"):
                record[f"{metric}_{key}"] = summary[key]
        records.append(record)
    return pd.DataFrame.from_records(records), pd.DataFrame.from_records(table["differences"])


def plot_table(table: Mapping[str, Any], path: Path) -> Path:
    """Each seed's point, the mean and its interval, per row; one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = table["metrics"]
    rows = table["rows"]
    figure, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 0.5 * len(rows) + 1.8), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for y, row in enumerate(rows):
            summary = row["metrics"][metric]
            points = list(summary["values"].values())
            axis.scatter(points, [y] * len(points), s=14, alpha=0.6, color="tab:blue")
            if summary["mean"] is not None:
                axis.plot([summary["mean"]], [y], marker="D", color="black")
            if summary["low"] is not None:
                axis.plot([summary["low"], summary["high"]], [y, y], color="black", linewidth=1.5)
        axis.set_yticks(range(len(rows)), [row["label"] for row in rows] if axis is axes[0][0] else [""] * len(rows))
        axis.invert_yaxis()
        axis.set_xlabel(f"{metric} pass@1")
        axis.grid(axis="x", alpha=0.3)
    figure.suptitle(f"each reporting seed (dots), mean (diamond), {int(round(table['confidence'] * 100))}% interval")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def table_file_paths(folder: Path) -> dict[str, Path]:
    """Where the table's files lie in the reporting stage's folder (what write_table_files writes, and the JSON)."""
    return {"json": folder / result_table_file(".json"), "markdown": folder / result_table_file(".md"),
            "csv": folder / result_table_file(".csv"), "differences": folder / RESULT_DIFFERENCES_FILE,
            "plot": folder / result_table_file(".png")}


def write_table_files(table: Mapping[str, Any], folder: Path) -> dict[str, Path]:
    """Markdown, CSV (rows and differences) and PNG beside the table's JSON; returns their paths."""
    rows, differences = table_frames(table)
    paths = {k: v for k, v in table_file_paths(folder).items() if k != "json"}
    atomic_write_text(paths["markdown"], render_markdown(table))
    atomic_write_text(paths["csv"], rows.to_csv(index=False))
    atomic_write_text(paths["differences"], differences.to_csv(index=False))
    plot_table(table, paths["plot"])
    return paths
