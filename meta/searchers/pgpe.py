"""PGPE (evotorch functional API, antithetic sampling, ClipUp by default): the default searcher."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, Searcher
from meta.searchers.serialize import from_plain, to_plain
from meta.seeding import seeded_global_torch


class PGPESearcher(Searcher):
    name = "pgpe"
    needs_even_population = True

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        center_learning_rate: float = 0.005,
        stdev_learning_rate: float = 0.1,
        stdev_init: float = 0.01,
        stdev_max_change: float = 0.2,
        ranking_method: str = "centered",
        optimizer: str = "clipup",
        optimizer_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        from evotorch.algorithms.functional import pgpe  # evotorch imports ray: keep it lazy

        self._state = pgpe(
            center_init=center_init.to(DTYPE),
            center_learning_rate=float(center_learning_rate),
            stdev_learning_rate=float(stdev_learning_rate),
            objective_sense="max",
            ranking_method=str(ranking_method),
            optimizer=str(optimizer),
            optimizer_config=dict(optimizer_config or {}),
            stdev_init=float(stdev_init),
            stdev_max_change=float(stdev_max_change),
            symmetric=True,
        )

    def ask(self, generation: int) -> torch.Tensor:
        from evotorch.algorithms.functional import pgpe_ask

        with seeded_global_torch(self.seed, "ask", generation):
            return pgpe_ask(self._state, popsize=self.popsize).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor) -> None:
        from evotorch.algorithms.functional import pgpe_tell

        self._check_tell(values, fitness)
        self._state = pgpe_tell(self._state, values.to(DTYPE), fitness.to(DTYPE))

    @property
    def center(self) -> torch.Tensor:
        return self._state.optimizer_state.center.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"functional": to_plain(self._state)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._state = from_plain(state["functional"])
