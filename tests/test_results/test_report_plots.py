"""The report's plots say what is true: legends beside the axes (covering no data), never-negative quantities on an
axis from zero with room above the highest point, both axes of the disk chart labelled, and a sentence instead of an
empty chart when there is nothing to draw."""
from __future__ import annotations

from typing import Any

import pandas as pd

from results.report.search import plots

GENERATIONS = pd.DataFrame({
    "generation": [0, 1, 2], "mean_fitness": [0.40, 0.42, 0.45], "std_fitness": [0.02, 0.03, 0.02],
    "max_fitness": [0.45, 0.47, 0.50], "control_fitness": [0.41, 0.40, 0.44],
    "mean_response_tokens": [3.240, 3.248, 3.256], "failed": [0, 0, 0], "unreadable": [0, 0, 0],
    "pending": [0, 0, 0], "disk_peak_max": [3.0e9, 3.2e9, 3.1e9], "disk_peak_mean": [2.5e9, 2.6e9, 2.7e9],
    "disk_peak_sum": [1.2e10, 1.3e10, 1.25e10]})
MEMBERS = pd.DataFrame({"generation": [0, 0, 1, 1, 2, 2, 0, 1, 2], "status": ["ok"] * 9,
                        "role": ["member"] * 6 + ["control"] * 3,
                        "fitness": [0.38, 0.45, 0.40, 0.47, 0.44, 0.50, 0.41, 0.40, 0.44]})


def _legend_off_the_axes(fig: Any) -> None:
    """No legend overlaps a plotting area, an axis's tick labels or its label."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for other in fig.axes:
            assert not box.overlaps(other.get_window_extent(renderer))
            for axis in (other.xaxis, other.yaxis):
                drawn_box = axis.get_tightbbox(renderer)  # None for an axis that draws nothing
                assert drawn_box is None or not box.overlaps(drawn_box), axis.get_label_text()


def test_legends_lie_beside_the_data(tmp_path, drawn):
    plots.plot_fitness(GENERATIONS, MEMBERS, tmp_path / "fitness.png")
    plots.plot_fitness_vs_control(MEMBERS, tmp_path / "fitness_vs_control.png")
    failing = GENERATIONS.assign(failed=[1, 0, 2])
    plots.plot_failures(failing, tmp_path / "failures.png")
    for name in ("fitness.png", "fitness_vs_control.png", "failures.png"):
        assert drawn[name].axes[0].get_legend() is not None, name
        _legend_off_the_axes(drawn[name])


def test_a_small_change_in_response_length_is_drawn_small(tmp_path, drawn):
    plots.plot_response_length(GENERATIONS, tmp_path / "response_length.png")
    low, high = drawn["response_length.png"].axes[0].get_ylim()
    assert low <= 0.0 and high > 3.256


def test_fitness_axis_starts_at_zero(tmp_path, drawn):
    plots.plot_fitness(GENERATIONS, MEMBERS, tmp_path / "fitness.png")
    assert drawn["fitness.png"].axes[0].get_ylim()[0] <= 0.0


def test_the_disk_chart_labels_both_axes_and_keeps_markers_off_the_border(tmp_path, drawn):
    plots.plot_disk(GENERATIONS, tmp_path / "disk.png")
    left, right = drawn["disk.png"].axes
    assert "one member" in left.get_ylabel() and "lines" in left.get_ylabel()
    assert "all members together" in right.get_ylabel() and "bars" in right.get_ylabel()
    assert left.get_ylim()[1] > GENERATIONS["disk_peak_max"].max() / 2**30  # GiB, with room above
    assert right.get_ylim()[1] > GENERATIONS["disk_peak_sum"].max() / 2**30
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "all members of the generation (right axis)" in labels
    _legend_off_the_axes(drawn["disk.png"])


def test_no_failures_is_a_sentence_not_an_empty_chart(tmp_path, drawn):
    plots.plot_failures(GENERATIONS, tmp_path / "failures.png")
    ax = drawn["failures.png"].axes[0]
    assert not ax.patches and any("no failures" in t.get_text() for t in ax.texts)
    assert (tmp_path / "failures.png").stat().st_size > 0
