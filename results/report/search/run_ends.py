"""An online search's particle runs in the members table (es=nres): which truncations ended a run, and each
episode's end scores; the column names and fitness labels the orchestrator writes and the views read.

Why a module of its own: the plots draw these and results/report/search/online.py's measures rank by them; the plots
may not import the measures, which draw the plots.
"""
from __future__ import annotations

import pandas as pd

from results.store.truncation import END_SCORE, STOP_STEP

#: the members table's column of a truncation's particle run number (the orchestrator writes it from the spec)
EPISODE_COLUMN = "episode"
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
