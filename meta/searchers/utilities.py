"""What every searcher's tell shares: tie-aware utilities, which members carry information, the tell summary.

Pass@1 takes values k/n and failed members tie at ``fitness_on_failure``, so ties are common. evotorch's rankers
give tied fitnesses distinct ranks (by position), which moves the centre a full step even when every member
scored the same. Here each tie group gets the mean of the utilities its members would have received (for the
linear rankers this is the average rank), so ordering within a tie carries no weight, and a generation whose
utilities are all equal carries no information: the searcher leaves its state as it was.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

RANKINGS = ("centered", "linear", "nes", "normalized", "raw")


@dataclass(frozen=True)
class TellSummary:
    """What a tell used; ``note`` is the line the orchestrator logs."""

    used: int
    dropped_pairs: int = 0
    no_information: bool = False
    note: str = ""


def check_ranking(name: str, method: str) -> str:
    if method not in RANKINGS:
        raise ValueError(f"es.ranking_method={method!r} is not one of {RANKINGS} (es={name})")
    return method


def all_tied(fitness: torch.Tensor) -> bool:
    return fitness.numel() == 0 or bool((fitness == fitness[0]).all())


def tie_averaged_utilities(fitness: torch.Tensor, ranking_method: str) -> torch.Tensor:
    """evotorch's utilities (higher fitness, higher utility) with each tie group given its mean utility;
    all zeros when every fitness is equal."""
    from evotorch.tools.ranking import rank

    fitness = fitness.to(torch.float64)
    if all_tied(fitness):
        return torch.zeros_like(fitness)
    utilities = rank(fitness, ranking_method, higher_is_better=True).to(torch.float64)
    for value in torch.unique(fitness):
        group = fitness == value
        if int(group.sum()) > 1:
            utilities[group] = utilities[group].mean()
    return utilities


def measured(popsize: int, late: torch.Tensor | None) -> torch.Tensor:
    """Members with a measurement (not late), as a bool mask."""
    if late is None:
        return torch.ones(popsize, dtype=torch.bool)
    return ~late.to(torch.bool)


def complete_pairs(first: torch.Tensor, second: torch.Tensor, ok: torch.Tensor, late: torch.Tensor | None) -> torch.Tensor:
    """Which antithetic pairs (member ``first[i]`` with ``second[i]``) have both halves ok and measured."""
    usable = ok.to(torch.bool) & measured(int(ok.shape[0]), late)
    return usable[first] & usable[second]


def pair_note(kept_pairs: int, dropped: int) -> str:
    note = f"{kept_pairs} complete antithetic pair(s)"
    if dropped:
        note += f"; {dropped} pair(s) with a failed or late half dropped"
    return note
