"""SNES through evotorch's ExpSeparableGaussian distribution object (sample / compute_gradients / update)."""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, Searcher
from meta.seeding import generator


class SNESSearcher(Searcher):
    name = "snes"

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        stdev_init: float = 0.01,
        center_learning_rate: float = 1.0,
        stdev_learning_rate: float | None = None,
        ranking_method: str = "nes",
    ) -> None:
        super().__init__(center_init, popsize, seed)
        if stdev_learning_rate is None:  # the standard SNES rate for the dimension
            stdev_learning_rate = 0.2 * (3 + math.log(self.dim)) / math.sqrt(self.dim)
        self.learning_rates = {"mu": float(center_learning_rate), "sigma": float(stdev_learning_rate)}
        self.ranking_method = str(ranking_method)
        self._dist = self._make(center_init.to(DTYPE), torch.full((self.dim,), float(stdev_init), dtype=DTYPE))

    def _make(self, mu: torch.Tensor, sigma: torch.Tensor) -> Any:
        from evotorch.distributions import ExpSeparableGaussian

        return ExpSeparableGaussian(solution_length=self.dim, parameters={"mu": mu, "sigma": sigma}, dtype=DTYPE)

    def ask(self, generation: int) -> torch.Tensor:
        return self._dist.sample(self.popsize, generator=generator(self.seed, "ask", generation)).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor) -> None:
        self._check_tell(values, fitness)
        grads = self._dist.compute_gradients(
            values.to(DTYPE), fitness.to(DTYPE), objective_sense="max", ranking_method=self.ranking_method
        )
        self._dist = self._dist.update_parameters(grads, learning_rates=self.learning_rates)

    @property
    def center(self) -> torch.Tensor:
        return self._dist.parameters["mu"].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"mu": self._dist.parameters["mu"].clone(), "sigma": self._dist.parameters["sigma"].clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._dist = self._make(state["mu"].to(DTYPE), state["sigma"].to(DTYPE))
