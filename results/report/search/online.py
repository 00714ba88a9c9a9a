"""An online search's members (es=nres) read as what they measure.

A truncation's fitness is the change of validation pass@1 over one piece of its particle's run: the searcher's
update needs it, but it is no score of the map, and ranking by it favours a lucky piece. Only a truncation that stops
at the run's horizon ends with a real full-run pass@1 (its end score). Selection's nominations, the "best" member,
meta.status, the report and the plots read a search through this module's ``SearchMeasure`` (``search_measure`` of a
stored search, ``measure_of`` a member's spec), the one place that tells an online search from one of whole runs: none
of them branches on the searcher, and none ranks or labels a change as a score.

Pandas and the run's files only (results/ imports nothing of meta/).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from core.records import MemberSpec, ResultRecord
from results.store.layout import SPEC_FILE
from results.store.run_store import RunStore
from results.report.search.run_ends import (END_SCORE_COLUMN, EPISODE_COLUMN, RUN_FITNESS, TRUNCATION_FITNESS,
                                            end_score_text, episode_progress, run_ends)
from results.store.truncation import END_SCORE, STOP_STEP

#: the state file's key, and the selection stage's candidate name, of a searcher's averaged centre
#: (meta/searchers/base.py: Searcher.averaged_center); absent where the searcher keeps none
AVERAGED_CENTER = "averaged_center"
#: best_member.json's key saying what an online search's best "fitness" is (a run's end score, end_score_text)
BEST_MEASURES = "fitness_is"


def progress_lines(members: pd.DataFrame, horizon: int, population: int) -> list[str]:
    """The progress an online search's views show: each episode's mean end score, or why there is none yet."""
    table = episode_progress(members, horizon)
    head = (f"progress: each episode's mean over its particles of the {end_score_text(horizon)}, a real full-run "
            f"score (a member's fitness is the {TRUNCATION_FITNESS})")
    if not len(table):
        return [head + ": no particle has ended its run yet"]
    return [head + ":", *(f"  episode {int(row.episode)}: {row.mean_end_score:.4f} (best {row.best_end_score:.4f}; "
                          f"{int(row.runs_ended)} of {population} particles, by generation {int(row.generation)})"
                          for row in table.itertuples())]



@dataclass(frozen=True)
class SearchMeasure:
    """What a search's member fitness measures, and so what its views rank and show: a search of whole runs (each
    member's fitness is a run's validation pass@1). ``ParticleRuns`` is an online search's."""

    #: a member's fitness, in words (the plots', meta.status's and the report's label)
    label: str = RUN_FITNESS
    #: the generation log's words for its best and its mean
    best_word: str = "best"
    mean_word: str = "fitness"
    #: the noise section's words for the spread across a generation's members, and whether it compares with one
    #: init's spread over seeds (a ratio is drawn)
    spread_words: str = "fitness"
    ratio_drawn: bool = True

    @property
    def ranked_by(self) -> str:
        """What "best", selection's nominations and the report's top table rank by, in words."""
        return self.label

    @property
    def unranked_text(self) -> str:
        """Why a search has no best member yet (export which=best)."""
        return "no member has succeeded yet"

    @property
    def best_text(self) -> str:
        """What the search's best member's figure is, in words (meta.run's last line on the search)."""
        return "best member's (single-run) fitness"

    def score(self, spec: MemberSpec, record: ResultRecord) -> float | None:
        """The score "best" ranks an ok population member by (None: it has none)."""
        return record.fitness

    def best_fields(self, spec: MemberSpec) -> dict[str, Any]:
        """What best_member.json keeps of the best member beyond its generation, index, fitness and params."""
        return {}

    def row_fields(self, spec: MemberSpec) -> dict[str, Any]:
        """The members table's columns of a member beyond its record's."""
        return {}

    def members_of(self, store: RunStore) -> pd.DataFrame:
        """The members table, where the views read more than a generation's records (an online search's run ends)."""
        return pd.DataFrame()

    def ranked(self, members: pd.DataFrame) -> tuple[pd.DataFrame, str, str | None]:
        """Selection's ranking of the population members that finished ok, best first (ties: earlier generation,
        lower index): the rows, the column of their score, and a warning when none ranks yet (None: nothing to say)."""
        # rows written before the control member existed have no role: they are population members
        role = members["role"].fillna("member") if "role" in members else "member"
        ok = members[(members["status"] == "ok") & (role == "member")]
        return ok.sort_values(["fitness", "generation", "index"], ascending=[False, True, True]), "fitness", None

    def center_fitness(self, state: Mapping[str, Any]) -> float | None:
        """The search fitness selection shows for the final centre: the last generation's mean fitness."""
        return state.get("mean_fitness")

    def top(self, members: pd.DataFrame, k: int) -> pd.DataFrame:
        """The report's top table: the ``k`` best members by fitness."""
        from results.report.search.snapshot import top_members

        return top_members(members, k)

    def top_title(self, count: int) -> str:
        """The report's heading of its top table."""
        return f"top {count} members (single runs: the best of many noisy measurements, see the noise section):"

    def progress_lines(self, members: pd.DataFrame, population: int) -> list[str]:
        """The search's progress beyond its generations' fitness (none: a generation's best and mean say it)."""
        return []

    def best_lines(self, store: RunStore) -> list[str]:
        """meta.status's line on the best so far beyond its generations' (none: a generation's best says it)."""
        return []

    def generation_text(self, members: pd.DataFrame, generation: int, fitness: list[float]) -> str:
        """meta.status's figures of a generation from its population members' fitness."""
        return f" | best {max(fitness):.4f}, mean {statistics.fmean(fitness):.4f}" if fitness else ""

    def extra_plots(self, members: pd.DataFrame, out: Path) -> list[Path]:
        """The report's figures beyond the ones every search has."""
        return []


@dataclass(frozen=True)
class ParticleRuns(SearchMeasure):
    """An online search's (es=nres): a member trains one truncation of its particle's run of ``horizon`` steps; its
    fitness is the change of pass@1 over it, and only a truncation that stops at the horizon has a score (its run's
    end score)."""

    horizon: int = 0
    label: str = TRUNCATION_FITNESS
    best_word: str = "best end of a run"
    mean_word: str = "change"
    spread_words: str = "their change over the truncation"
    ratio_drawn: bool = False  # a change over a piece of a run does not compare with one init's spread over runs

    @property
    def ranked_by(self) -> str:
        return end_score_text(self.horizon)

    @property
    def unranked_text(self) -> str:
        return (f"no particle has ended its run (step {self.horizon}) yet, and an online search's best member is the "
                "best end score of a run, not a truncation's change")

    @property
    def best_text(self) -> str:
        return (f"best particle run's end score ({self.ranked_by}; a single run: the selection runs measure the "
                "init)")

    def score(self, spec: MemberSpec, record: ResultRecord) -> float | None:
        if record.diagnostics.get(STOP_STEP) == self.horizon and record.diagnostics.get(END_SCORE) is not None:
            return float(record.diagnostics[END_SCORE])
        return None

    def best_fields(self, spec: MemberSpec) -> dict[str, Any]:
        return {**self.row_fields(spec), BEST_MEASURES: self.ranked_by}

    def row_fields(self, spec: MemberSpec) -> dict[str, Any]:
        return {EPISODE_COLUMN: int((spec.truncation or {})["episode"])}  # the particle run it belongs to

    def members_of(self, store: RunStore) -> pd.DataFrame:
        return store.read_members()

    def ranked(self, members: pd.DataFrame) -> tuple[pd.DataFrame, str, str | None]:
        ended = run_ends(members, self.horizon)
        note = None if len(ended) else (
            f"selection: no particle has ended its run (step {self.horizon}) yet, so no member is nominated: an "
            "online search nominates by a run's end score, not a truncation's change")
        return ended, END_SCORE_COLUMN, note

    def center_fitness(self, state: Mapping[str, Any]) -> float | None:
        return None  # its mean fitness is a mean change over one truncation: no score of the centre

    def top(self, members: pd.DataFrame, k: int) -> pd.DataFrame:
        columns = ["generation", "index", EPISODE_COLUMN, END_SCORE_COLUMN, "mean_response_tokens", "wall_time_s"]
        ended = run_ends(members, self.horizon)
        top = ended[[c for c in columns if c in ended]].head(k).reset_index(drop=True)
        return top.rename(columns={END_SCORE_COLUMN: "end_score"})

    def top_title(self, count: int) -> str:
        return (f"top {count} particle runs by {self.ranked_by} (single runs: the best of many noisy measurements, "
                "see the noise section):")

    def progress_lines(self, members: pd.DataFrame, population: int) -> list[str]:
        return progress_lines(members, self.horizon, population)

    def best_lines(self, store: RunStore) -> list[str]:
        latest = store.latest_state()
        best = (latest[1].get("best") if latest is not None else None) or {}
        if BEST_MEASURES not in best:  # none yet, or a search stored before it kept a run's end score (a change)
            return []
        return [f"  best run so far: member {best['index']:03d} of generation {best['generation']} (episode "
                f"{best.get(EPISODE_COLUMN)}): {best['fitness']:.4f}"]

    def generation_text(self, members: pd.DataFrame, generation: int, fitness: list[float]) -> str:
        # a change over one truncation has no "best": a run's end score has
        text = f" | mean change {statistics.fmean(fitness):.4f}" if fitness else ""
        ended = run_ends(members[members["generation"] == generation], self.horizon) if len(members) else members
        if not len(ended):
            return text
        scores = ended[END_SCORE_COLUMN].astype(float)
        return (text + f" | {len(ended)} run(s) ended at step {self.horizon}: best {scores.max():.4f}, "
                f"mean {scores.mean():.4f}")

    def extra_plots(self, members: pd.DataFrame, out: Path) -> list[Path]:
        from results.report.search.plots import plot_episodes

        return [plot_episodes(members, self.horizon, out / "episodes.png")]


def measure_of(spec: MemberSpec | None) -> SearchMeasure:
    """The measure of the search ``spec`` belongs to: an online search's where the member continues a particle's
    run (its truncation), else one of whole runs (also when no member exists yet)."""
    if spec is None or spec.truncation is None:
        return SearchMeasure()
    return ParticleRuns(horizon=spec.work.horizon)


def search_measure(store: RunStore) -> SearchMeasure:
    """The measure of the search ``store`` holds, from its first member's stored spec (one of whole runs while no
    member has been submitted, or its spec is unreadable)."""
    try:
        data = json.loads((store.member_dir(0, 0) / SPEC_FILE).read_text())
        return measure_of(MemberSpec.from_dict(data) if isinstance(data, dict) else None)
    except (OSError, KeyError, TypeError, ValueError):
        return SearchMeasure()
