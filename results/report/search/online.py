"""An online search's members (es=nres) read as what they measure.

A truncation's fitness is the change of validation pass@1 over one piece of its particle's run: the searcher's
update needs it, but it is no score of the map, and ranking by it favours a lucky piece. Only a truncation that stops
at the run's horizon ends with a real full-run pass@1 (its end score). Selection's nominations, the "best" member,
meta.status, the report and the plots read an online search through this module, so none of them ranks or labels a
change as a score; a search of whole runs reads as before.

Pandas and the run's files only (results/ imports nothing of meta/).
"""
from __future__ import annotations

import json

import pandas as pd

from core.records import MemberSpec
from results.store.layout import SPEC_FILE
from results.store.run_store import RunStore
from results.store.truncation import END_SCORE, STOP_STEP

#: the members table's column of a truncation's particle run number (the orchestrator writes it from the spec)
EPISODE_COLUMN = "episode"
#: the state file's key, and the selection stage's candidate name, of a searcher's averaged centre
#: (meta/searchers/base.py: Searcher.averaged_center); absent where the searcher keeps none
AVERAGED_CENTER = "averaged_center"
#: best_member.json's key saying what an online search's best "fitness" is (a run's end score, end_score_text)
BEST_MEASURES = "fitness_is"
#: what a member's fitness is, as the plots, meta.status and the report label it
RUN_FITNESS = "validation pass@1"
TRUNCATION_FITNESS = "change of validation pass@1 over the truncation"


def diagnostic_column(name: str) -> str:
    """The members table's column of a record's diagnostic ``name`` (the orchestrator writes them so)."""
    return f"diag_{name}"


STOP_COLUMN = diagnostic_column(STOP_STEP)
END_SCORE_COLUMN = diagnostic_column(END_SCORE)


def end_score_text(horizon: int) -> str:
    """What a run's end score is, in words."""
    return f"validation pass@1 at the end of a particle's run (step {horizon})"


def run_horizon(store: RunStore) -> int | None:
    """The particles' run length when ``store`` holds an online search (its first member's spec carries a
    truncation), else None: its members train whole runs, or none has been submitted yet."""
    try:
        spec = json.loads((store.member_dir(0, 0) / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("truncation"), dict):
        return None
    try:
        return MemberSpec.from_dict(spec).work.horizon
    except (KeyError, TypeError, ValueError):
        return None


def fitness_label(horizon: int | None) -> str:
    """What the search's member fitness is (``horizon``: run_horizon's answer)."""
    return TRUNCATION_FITNESS if horizon is not None else RUN_FITNESS


def run_ends(members: pd.DataFrame, horizon: int) -> pd.DataFrame:
    """The population's truncations that finished ok at ``horizon``, best end score first (ties: earlier generation,
    lower index): each a particle's whole run, scored at its end."""
    needed = {STOP_COLUMN, END_SCORE_COLUMN, "status", "generation", "index"}
    if not len(members) or not needed <= set(members.columns):
        return members.iloc[0:0]
    role = members["role"].fillna("member") if "role" in members else pd.Series("member", index=members.index)
    ended = members[(members["status"] == "ok") & (role == "member")
                    & (members[STOP_COLUMN].astype(float) == float(horizon)) & members[END_SCORE_COLUMN].notna()]
    return ended.sort_values([END_SCORE_COLUMN, "generation", "index"], ascending=[False, True, True])


def episode_progress(members: pd.DataFrame, horizon: int) -> pd.DataFrame:
    """Per episode number, the mean over its particles of the end score at ``horizon``: the search's progress
    (columns episode, runs_ended, mean_end_score, best_end_score, generation: the last one in which they ended)."""
    columns = ["episode", "runs_ended", "mean_end_score", "best_end_score", "generation"]
    ended = run_ends(members, horizon)
    if not len(ended) or EPISODE_COLUMN not in ended:
        return pd.DataFrame(columns=columns)
    ended = ended.dropna(subset=[EPISODE_COLUMN])
    grouped = ended.groupby(ended[EPISODE_COLUMN].astype(int))
    table = pd.DataFrame({"runs_ended": grouped.size(), "mean_end_score": grouped[END_SCORE_COLUMN].mean(),
                          "best_end_score": grouped[END_SCORE_COLUMN].max(), "generation": grouped["generation"].max()})
    return table.rename_axis("episode").reset_index()[columns]


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

