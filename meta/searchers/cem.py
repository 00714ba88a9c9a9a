"""Cross-entropy method (evotorch functional API): keep the best fraction, refit a separable Gaussian.

Parents are chosen here, then evotorch refits on them alone (its parenthood ratio set to 1 for that call). Ties:
the members strictly above the k-th best fitness are parents; the tie group AT that fitness joins whole (never a
part of it picked by position) unless that would make every member a parent, in which case only the strictly
better ones are kept. Every member tied (or fewer than two measured) is a generation with no information: the
distribution is left as it was. Late members are left out; failed ones keep fitness_on_failure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from meta.searchers.base import DTYPE, EarlyStopRule, Searcher, SearcherSettings, setting
from meta.searchers.serialize import from_plain, to_plain
from meta.searchers.utilities import TellSummary, all_tied, measured
from core.seeding import seeded_global_torch


@dataclass
class CEMSettings(SearcherSettings):
    """es=cem's settings (conf/es/cem.yaml composes on them as es/cem_schema)."""

    parenthood_ratio: float = setting(0.5, "the fraction of the population kept as parents (<= 0.5: early stopping "
                                           "is exact)")
    stdev_max_change: Optional[float] = setting(0.2, "the largest relative change of the stdev per generation; null: "
                                                     "none")
    stdev_min: Optional[float] = setting(None, "the smallest stdev; null: none")


class CEMSearcher(Searcher):
    name = "cem"
    settings_class = CEMSettings
    imports = ("evotorch", "ray")  # evotorch imports ray at import time
    # CEM never uses a non-parent: stopping one changes nothing while the parents stay above the median
    early_stop = EarlyStopRule(when="parenthood_ratio <= 0.5",
                               example={"name": "cem", "radius": 0.1, "parenthood_ratio": 0.5})

    @classmethod
    def early_stop_refusal(cls, settings: Mapping[str, Any]) -> str | None:
        ratio = float(settings.get("parenthood_ratio", CEMSettings.parenthood_ratio))
        if ratio > 0.5:
            return (f"es=cem with parenthood_ratio={ratio} takes parents from below the median, where early "
                    "stopping cuts; use parenthood_ratio <= 0.5")
        return None

    @classmethod
    def stop_capacity(cls, settings: Mapping[str, Any], population: int) -> int:
        """CEM's non-parents: N - int(N x parenthood_ratio)."""
        return population - max(1, int(population * float(settings.get("parenthood_ratio", CEMSettings.parenthood_ratio))))

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        parenthood_ratio: float,
        radius: float,
        stdev_max_change: float | None,
        stdev_min: float | None,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        from evotorch.algorithms.functional import cem

        self.parenthood_ratio = float(parenthood_ratio)
        if not 0.0 < parenthood_ratio < 1.0 or int(popsize * parenthood_ratio) < 1:
            raise ValueError(f"es.parenthood_ratio={parenthood_ratio} must select at least one of {popsize} members")
        self._state = cem(
            center_init=center_init.to(DTYPE),
            parenthood_ratio=float(parenthood_ratio),
            objective_sense="max",
            stdev_init=float(radius),  # evotorch's name for the search radius
            stdev_max_change=stdev_max_change,
            stdev_min=stdev_min,
        )

    def ask(self, generation: int) -> torch.Tensor:
        from evotorch.algorithms.functional import cem_ask

        with seeded_global_torch(self.seed, "ask", generation):
            return cem_ask(self._state, popsize=self.popsize).clone()

    def parents(self, fitness: torch.Tensor) -> torch.Tensor:
        """Indices (into ``fitness``) of the parents under the tie rule above; empty when all are tied."""
        if all_tied(fitness):
            return torch.empty(0, dtype=torch.long)
        k = max(1, int(fitness.shape[0] * self.parenthood_ratio))
        boundary = torch.sort(fitness, descending=True).values[k - 1]
        better = fitness > boundary
        chosen = better | (fitness == boundary)
        if bool(chosen.all()):
            chosen = better
        return torch.nonzero(chosen).flatten()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        from evotorch.algorithms.functional import cem_tell

        self._check_tell(values, fitness)
        keep = measured(self.popsize, late)
        values, fitness = values.to(DTYPE)[keep], fitness.to(DTYPE)[keep]
        parents = self.parents(fitness) if fitness.shape[0] >= 2 else torch.empty(0, dtype=torch.long)
        note = f"{int(keep.sum())} measured member(s), {parents.numel()} parent(s)"
        if parents.numel() == 0:
            return TellSummary(used=int(keep.sum()), no_information=True,
                               note=note + "; no information (all tied): unchanged")
        every_parent = self._state._replace(parenthood_ratio=1.0)
        new = cem_tell(every_parent, values[parents], fitness[parents])
        self._state = new._replace(parenthood_ratio=self._state.parenthood_ratio)
        return TellSummary(used=int(keep.sum()), note=note)

    @property
    def center(self) -> torch.Tensor:
        return self._state.center.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"functional": to_plain(self._state)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._state = from_plain(state["functional"])
