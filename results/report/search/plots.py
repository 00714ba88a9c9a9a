"""PNG plots of an ES run, drawn with matplotlib's Agg canvas (no display, no pyplot global state).

Each plot is rendered to memory and written atomically, so a report re-run while someone views the file never
leaves a half-written image.
"""
from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from results.report.search.run_ends import END_SCORE_COLUMN, EPISODE_COLUMN, RUN_FITNESS, episode_progress, run_ends
from results.store.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

SIZE_IN = (7.6, 4.0)  # wide enough for a legend beside the axes
DPI = 100


def _new_figure() -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _finish_per_generation(fig: Figure, ax: Any, ylabel: str, title: str, path: str | Path) -> Path:
    """Every plot of a run has generations on x: label the axes, title it, save it."""
    ax.set_xlabel("generation")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, path)


def _save(fig: Figure, path: str | Path) -> Path:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # generations are whole numbers
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")  # the legend beside the axes included
    return atomic_write_bytes(path, buffer.getvalue())


def _no_data(ax: object, what: str) -> None:
    _say(ax, f"no {what} yet")


def _say(ax: Any, text: str) -> None:
    """A sentence in place of an empty chart (no axis ticks that would suggest a measured range)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_yticks([])


def _legend_beside(ax: Any, handles: list[Any] | None = None, below: bool = False) -> None:
    """The legend right of the axes (``below`` them where a right-hand axis takes that side), where it can cover no
    point, line, band or axis label."""
    kwargs: dict[str, Any] = {"handles": handles} if handles is not None else {}
    if below:
        kwargs.update(loc="upper center", bbox_to_anchor=(0.5, -0.26), ncol=2)
    else:
        kwargs.update(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.legend(borderaxespad=0.0, fontsize=8, **kwargs)


def _from_zero(ax: Any) -> None:
    """A y axis that starts at zero (for quantities that are never negative), with room above the highest point,
    so that a small change looks small and no marker sits on the border."""
    low, high = ax.get_ylim()
    ax.set_ylim(min(0.0, low), high + 0.08 * (high - min(0.0, low)))


def plot_fitness(generations: pd.DataFrame, members: pd.DataFrame, path: str | Path,
                 label: str = RUN_FITNESS) -> Path:
    """Members' fitness as dots, the population mean with a +-1 std band, and the best member per generation;
    ``label`` says what a member's fitness is (an online search's: a change over its truncation)."""
    fig, ax = _new_figure()
    ok = members[members["status"] == "ok"] if len(members) else members
    if len(ok) and "role" in ok:
        ok = ok[ok["role"] != "control"]
    has = generations.dropna(subset=["mean_fitness"]) if len(generations) else generations
    if len(ok):
        ax.scatter(ok["generation"], ok["fitness"].astype(float), s=10, alpha=0.35, color="tab:gray", label="members")
    control = generations.dropna(subset=["control_fitness"]) if "control_fitness" in generations else generations[:0]
    if len(control):
        ax.plot(control["generation"], control["control_fitness"], marker="s", linestyle="--", color="tab:red",
                label="control (centre, generation's seed)")
    if len(has):
        std = has["std_fitness"].fillna(0.0)
        ax.fill_between(has["generation"], has["mean_fitness"] - std, has["mean_fitness"] + std, alpha=0.25,
                        color="tab:blue", label="mean ± std")
        ax.plot(has["generation"], has["mean_fitness"], marker="o", color="tab:blue", label="mean")
        ax.plot(has["generation"], has["max_fitness"], marker="^", color="tab:green", label="max")
        _legend_beside(ax)
        if label == RUN_FITNESS:  # a change over a truncation may be negative
            _from_zero(ax)
        else:
            ax.axhline(0.0, color="black", linewidth=0.8)
    else:
        _no_data(ax, "finished members")
    return _finish_per_generation(fig, ax, f"fitness ({label})", "Fitness per generation", path)


def plot_episodes(members: pd.DataFrame, horizon: int, path: str | Path) -> Path:
    """An online search's progress per episode: each particle run's end score at ``horizon`` (dots) and their mean
    (line): real full-run scores, where its members' fitness is a change over one truncation."""
    fig, ax = _new_figure()
    ended = run_ends(members, horizon)
    table = episode_progress(members, horizon)
    if len(table):
        ended = ended.dropna(subset=[EPISODE_COLUMN])
        ax.scatter(ended[EPISODE_COLUMN].astype(int), ended[END_SCORE_COLUMN].astype(float), s=10, alpha=0.35,
                   color="tab:gray", label="a particle's run")
        ax.plot(table["episode"], table["mean_end_score"], marker="o", color="tab:blue", label="episode mean")
        _legend_beside(ax)
        _from_zero(ax)
    else:
        _say(ax, f"no particle has ended its run (step {horizon}) yet")
    ax.set_xlabel("episode (one run per particle)")
    ax.set_ylabel(f"validation pass@1 at step {horizon}")
    ax.set_title("Progress: the end scores of the particles' runs")
    return _save(fig, path)


def plot_fitness_vs_control(members: pd.DataFrame, path: str | Path) -> Path:
    """Each member's fitness minus its generation's control member (the unperturbed centre, same seed): a
    generation-wide shift of the dots is seed-to-seed drift, not progress of the search."""
    fig, ax = _new_figure()
    has = members if len(members) and "role" in members else members.iloc[0:0]
    ok = has[has["status"] == "ok"] if len(has) else has
    control = ok[ok["role"] == "control"].set_index("generation")["fitness"] if len(ok) else pd.Series(dtype=float)
    rel = ok[(ok["role"] == "member") & ok["generation"].isin(control.index)] if len(ok) else ok
    if len(rel):
        diff = rel["fitness"].astype(float) - rel["generation"].map(control).astype(float)
        ax.scatter(rel["generation"], diff, s=10, alpha=0.5, color="tab:gray", label="member - control")
        ax.axhline(0.0, color="tab:red", linewidth=1, label="control")
        _legend_beside(ax)
    else:
        _no_data(ax, "members with a finished control")
    return _finish_per_generation(fig, ax, "fitness - control fitness", "Members relative to the control", path)


def plot_response_length(generations: pd.DataFrame, path: str | Path) -> Path:
    """Mean response length (tokens) of the finished members per generation."""
    fig, ax = _new_figure()
    has = generations.dropna(subset=["mean_response_tokens"]) if len(generations) else generations
    if len(has):
        ax.plot(has["generation"], has["mean_response_tokens"], marker="o", color="tab:orange")
        _from_zero(ax)  # a 0.02-token change must not draw as a steep rise
    else:
        _no_data(ax, "response lengths")
    return _finish_per_generation(fig, ax, "mean response length (tokens)", "Response length per generation", path)


def plot_failures(generations: pd.DataFrame, path: str | Path) -> Path:
    """Failed, unreadable and still-pending members per generation, stacked; a sentence when there are none."""
    fig, ax = _new_figure()
    counted = ("failed", "unreadable", "pending")
    if len(generations) and not generations[list(counted)].astype(float).to_numpy().any():
        _say(ax, f"no failures ({len(generations)} generation(s), every member finished ok)")
    elif len(generations):
        bottom = pd.Series(0, index=generations.index, dtype=float)
        for column, color in (("failed", "tab:red"), ("unreadable", "tab:purple"), ("pending", "tab:gray")):
            values = generations[column].astype(float)
            ax.bar(generations["generation"], values, bottom=bottom, color=color, label=column)
            bottom = bottom + values
        _legend_beside(ax)
    else:
        _no_data(ax, "generations")
    return _finish_per_generation(fig, ax, "members", "Failures per generation", path)


def _byte_unit(largest: float) -> tuple[float, str]:
    """The binary unit that shows ``largest`` as a number below 1024."""
    scale, unit = 1.0, "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if largest < 1024 * scale or unit == "PiB":
            break
        scale *= 1024
    return scale, unit


def plot_disk(generations: pd.DataFrame, path: str | Path) -> Path:
    """Peak disk per member (max and mean) per generation, and the generation's sum (bars, right axis): what a
    generation may need at once when its members run side by side."""
    fig, ax = _new_figure()
    has = generations.dropna(subset=["disk_peak_max"]) if len(generations) else generations
    if len(has):
        scale, unit = _byte_unit(float(has["disk_peak_max"].max()))
        ax.plot(has["generation"], has["disk_peak_max"] / scale, marker="^", color="tab:red", label="member max")
        ax.plot(has["generation"], has["disk_peak_mean"] / scale, marker="o", color="tab:blue", label="member mean")
        _from_zero(ax)
        ylabel = f"peak disk of one member ({unit}): lines"
        total = ax.twinx()
        sum_scale, sum_unit = _byte_unit(float(has["disk_peak_sum"].max()))
        bars = total.bar(has["generation"], has["disk_peak_sum"] / sum_scale, alpha=0.2, color="tab:gray",
                         label="all members of the generation (right axis)")
        total.set_ylabel(f"all members together ({sum_unit}): bars")
        _from_zero(total)
        ax.set_zorder(total.get_zorder() + 1)  # the lines in front of the bars
        ax.patch.set_visible(False)
        _legend_beside(ax, [*ax.get_legend_handles_labels()[0], bars], below=True)
    else:
        _no_data(ax, "disk measurements")
        ylabel = "peak per member"
    return _finish_per_generation(fig, ax, ylabel, "Disk per generation (member work dirs)", path)
