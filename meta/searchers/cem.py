"""Cross-entropy method (evotorch functional API): keep the best fraction, refit a separable Gaussian."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, Searcher
from meta.searchers.serialize import from_plain, to_plain
from meta.seeding import seeded_global_torch


class CEMSearcher(Searcher):
    name = "cem"

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        parenthood_ratio: float = 0.5,
        stdev_init: float = 0.01,
        stdev_max_change: float | None = 0.2,
        stdev_min: float | None = None,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        from evotorch.algorithms.functional import cem

        if not 0.0 < parenthood_ratio < 1.0 or int(popsize * parenthood_ratio) < 1:
            raise ValueError(f"es.parenthood_ratio={parenthood_ratio} must select at least one of {popsize} members")
        self._state = cem(
            center_init=center_init.to(DTYPE),
            parenthood_ratio=float(parenthood_ratio),
            objective_sense="max",
            stdev_init=float(stdev_init),
            stdev_max_change=stdev_max_change,
            stdev_min=stdev_min,
        )

    def ask(self, generation: int) -> torch.Tensor:
        from evotorch.algorithms.functional import cem_ask

        with seeded_global_torch(self.seed, "ask", generation):
            return cem_ask(self._state, popsize=self.popsize).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor) -> None:
        from evotorch.algorithms.functional import cem_tell

        self._check_tell(values, fitness)
        self._state = cem_tell(self._state, values.to(DTYPE), fitness.to(DTYPE))

    @property
    def center(self) -> torch.Tensor:
        return self._state.center.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"functional": to_plain(self._state)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._state = from_plain(state["functional"])
