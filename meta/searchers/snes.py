"""SNES through evotorch's ExpSeparableGaussian distribution object (sample / compute_gradients / update).

No antithetic pairs here: late members are left out, failed ones keep fitness_on_failure (tied at the bottom).
Utilities are tie-averaged (meta/searchers/utilities.py) and given to evotorch as "raw"; fewer than two measured
members or all utilities equal leave the distribution as it was.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from meta.searchers.base import DTYPE, EarlyStopRule, Searcher, SearcherSettings, setting
from meta.searchers.utilities import TellSummary, check_ranking, measured, tie_averaged_utilities
from core.seeding import generator


@dataclass
class SNESSettings(SearcherSettings):
    """es=snes's settings (conf/es/snes.yaml composes on them as es/snes_schema)."""

    center_learning_rate: float = setting(1.0, "the learning rate of the centre (mu)")
    stdev_learning_rate: Optional[float] = setting(None, "the learning rate of the stdev; null: the standard "
                                                         "0.2 (3 + ln d) / sqrt(d)")
    ranking_method: str = setting("nes", "how fitnesses become utilities (ties averaged); nes: the bottom half "
                                         "shares one utility, which early stopping needs")


class SNESSearcher(Searcher):
    name = "snes"
    settings_class = SNESSettings
    imports = ("evotorch", "ray")  # evotorch imports ray at import time
    # evotorch's nes weights are 0 on the bottom floor(N/2) ranks before the shared shift: one utility for them all
    early_stop = EarlyStopRule(when="ranking_method nes",
                               example={"name": "snes", "radius": 0.1, "ranking_method": "nes"})

    @classmethod
    def early_stop_refusal(cls, settings: Mapping[str, Any]) -> str | None:
        ranking = settings.get("ranking_method", SNESSettings.ranking_method)
        if ranking != "nes":
            return (f"es=snes with ranking_method={ranking!r} weighs every rank differently; only `nes` gives the "
                    "bottom half one shared utility (use es.ranking_method=nes)")
        return None

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        radius: float,
        center_learning_rate: float,
        stdev_learning_rate: float | None,
        ranking_method: str,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        if stdev_learning_rate is None:  # the standard SNES rate for the dimension
            stdev_learning_rate = 0.2 * (3 + math.log(self.dim)) / math.sqrt(self.dim)
        self.learning_rates = {"mu": float(center_learning_rate), "sigma": float(stdev_learning_rate)}
        self.ranking_method = check_ranking(self.name, str(ranking_method))
        self._dist = self._make(center_init.to(DTYPE), torch.full((self.dim,), float(radius), dtype=DTYPE))

    def _make(self, mu: torch.Tensor, sigma: torch.Tensor) -> Any:
        from evotorch.distributions import ExpSeparableGaussian

        return ExpSeparableGaussian(solution_length=self.dim, parameters={"mu": mu, "sigma": sigma}, dtype=DTYPE)

    def ask(self, generation: int) -> torch.Tensor:
        return self._dist.sample(self.popsize, generator=generator(self.seed, "ask", generation)).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        self._check_tell(values, fitness)
        keep = measured(self.popsize, late)
        used = int(keep.sum())
        note = f"{used} measured member(s), {int((~ok.to(torch.bool) & keep).sum())} failed at fitness_on_failure"
        utilities = tie_averaged_utilities(fitness.to(DTYPE)[keep], self.ranking_method)
        if used < 2 or not bool(utilities.any()):
            return TellSummary(used=used, no_information=True, note=note + "; no information (all tied): unchanged")
        grads = self._dist.compute_gradients(values.to(DTYPE)[keep], utilities, objective_sense="max",
                                             ranking_method="raw")
        self._dist = self._dist.update_parameters(grads, learning_rates=self.learning_rates)
        return TellSummary(used=used, note=note)

    @property
    def center(self) -> torch.Tensor:
        return self._dist.parameters["mu"].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"mu": self._dist.parameters["mu"].clone(), "sigma": self._dist.parameters["sigma"].clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._dist = self._make(state["mu"].to(DTYPE), state["sigma"].to(DTYPE))
