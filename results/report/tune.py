"""The report of a ``meta.tune`` run (``python -m results.report RUN_DIR`` picks it for a run dir with a study.json).

Reads the study from its store (live or finished) and writes: trials.csv (one row per trial: state, value, each
run's value, params, where it was pruned and the running time that saved, its error), best.json (the best complete
trial), Optuna's parameter importances (importances.csv), and PNG plots made by Optuna's matplotlib visualizations:
optimisation history, parallel coordinate, slice and importances. Every table carries the run's provenance.
"""
from __future__ import annotations

import io
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from results.store.atomic import atomic_write_bytes, atomic_write_text
from results.store.layout import REPORT_DIR
from results.store.run_store import RunStore
from results.store.study_store import (ERROR_ATTR, LOST_ATTR, PRUNED_STEP_ATTR, RUN_VALUES_ATTR, SAVED_ATTR,
                                  best_complete_trial, load_study, read_study_file, state_name)

logger = logging.getLogger(__name__)


@dataclass
class TuneReport:
    root: Path
    study_name: str
    storage: str
    trials: pd.DataFrame
    best: dict[str, Any] | None
    importances: dict[str, float]
    importance_note: str
    provenance: dict[str, str]
    files: list[Path]
    skipped: list[str]


def trials_table(study: Any) -> pd.DataFrame:
    """One row per trial, in trial order; state LOST for a trial the tuner lost (FAIL in the study, not counted)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        duration = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        rows.append({
            "number": t.number, "state": state_name(t), "value": t.value,
            "run_values": ";".join(f"{v:.4f}" for v in attrs.get(RUN_VALUES_ATTR, [])),
            **{f"param:{k}": v for k, v in t.params.items()},
            "last_step": max(t.intermediate_values, default=None),
            "pruned_at_step": attrs.get(PRUNED_STEP_ATTR),
            "saved_member_s": attrs.get(SAVED_ATTR),
            "duration_s": duration, "error": (attrs.get(ERROR_ATTR) or attrs.get(LOST_ATTR) or "")[:300],
        })
    return pd.DataFrame(rows)


def _best(study: Any) -> dict[str, Any] | None:
    best = best_complete_trial(study)
    if best is None:
        return None
    return {"number": best.number, "value": best.value, "params": dict(best.params),
            "run_values": best.user_attrs.get(RUN_VALUES_ATTR, [])}


def _importances(study: Any) -> tuple[dict[str, float], str]:
    import optuna

    try:
        return dict(optuna.importance.get_param_importances(study)), ""
    except (RuntimeError, ValueError) as exc:  # fewer than two complete trials, or no parameter varies
        return {}, f"not available: {exc}"


def _save_plot(draw: Callable[[], Any], path: Path) -> Path:
    """Draw with one of optuna.visualization.matplotlib's functions and write the figure as PNG."""
    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        axes = draw()
    figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def build_tune_report(run_dir: str | Path, out_dir: str | Path | None = None) -> TuneReport:
    """Read the tune run's study and write its tables and plots; ValueError when run_dir is not a tune run."""
    from optuna.visualization import matplotlib as vis

    root = Path(run_dir)
    info = read_study_file(root)
    if info is None:
        raise ValueError(f"{root} is not a tune run dir")
    study = load_study(root)
    store = RunStore(root)
    manifest = store.read_manifest() if store.manifest_path.exists() else {}
    provenance = {key: str(manifest.get(key, "unknown")) for key in ("run_id", "config_hash", "code_version", "seed")}
    out = Path(out_dir) if out_dir is not None else root / REPORT_DIR
    table = trials_table(study)
    best = _best(study)
    importances, note = _importances(study)
    files = [
        atomic_write_text(out / "trials.csv", table.assign(**provenance).to_csv(index=False)),
        atomic_write_text(out / "best.json", json.dumps({"best": best, **provenance}, indent=2)),
        atomic_write_text(out / "importances.csv", pd.DataFrame(
            [{"param": k, "importance": v, **provenance} for k, v in importances.items()]).to_csv(index=False)),
    ]
    skipped: list[str] = []
    plots = {"optimization_history.png": lambda: vis.plot_optimization_history(study),
             "parallel_coordinate.png": lambda: vis.plot_parallel_coordinate(study),
             "slice.png": lambda: vis.plot_slice(study)}
    if importances:
        plots["importances.png"] = lambda: vis.plot_param_importances(study)
    for name, draw in plots.items():
        if best is None:
            skipped.append(f"{name}: no complete trial yet")
            continue
        try:
            files.append(_save_plot(draw, out / name))
        except (ValueError, RuntimeError, TypeError) as exc:
            skipped.append(f"{name}: {exc}")
    return TuneReport(root, info["study_name"], info["storage"], table, best, importances, note, provenance, files,
                      skipped)


def format_tune_report(report: TuneReport) -> str:
    p = report.provenance
    counts = report.trials["state"].value_counts().to_dict() if len(report.trials) else {}
    best = report.best
    lines = [
        f"tune run {report.root}  (run_id {p['run_id']}, seed {p['seed']}, code {p['code_version']})",
        f"study {report.study_name!r} in {report.storage}; trials: "
        + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none yet"),
        "",
        "trials:",
        report.trials.to_string(index=False, float_format=lambda x: f"{x:.4g}") if len(report.trials) else "  (none)",
        "",
        "best (one trial's mean over its seeds: a noisy measurement; retrain it with more seeds before reporting):",
        f"  trial {best['number']}: {best['value']:.4f} with {best['params']}" if best else "  no complete trial yet",
        "",
        "parameter importances (Optuna, fANOVA):",
        *([f"  {k}: {v:.3f}" for k, v in report.importances.items()] or [f"  {report.importance_note}"]),
    ]
    if report.skipped:
        lines += ["", "plots not drawn:"] + [f"  {s}" for s in report.skipped]
    lines += ["", "wrote:"] + [f"  {f}" for f in report.files]
    return "\n".join(lines) + "\n"
