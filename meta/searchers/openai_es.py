"""The NM-GRPO-ES authors' rule (SPEC.md section 3), behind the common interface.

Antithetic OpenAI-ES with raw fitness: gradient = sum over non-failed members of f_i * eps_i / (N_ok * sigma),
step ``learning_rate``; sigma decays by ``sigma_decay`` every generation. The step is ACCEPTED only if the
population's mean fitness (failed members included at fitness_on_failure) beats the best mean so far;
otherwise the centre stays and the top ``elite_fraction`` of members are re-used in the next population
(the rest are fresh antithetic pairs; one elite is dropped if needed to keep the pairs whole).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, Searcher
from meta.seeding import generator


class OpenAIESEliteSearcher(Searcher):
    name = "openai_es_elite"
    needs_even_population = True

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        sigma: float = 0.01,
        sigma_decay: float = 0.99,
        learning_rate: float = 0.01,
        elite_fraction: float = 0.25,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        if not 0.0 <= elite_fraction < 1.0:
            raise ValueError(f"es.elite_fraction={elite_fraction} must be in [0, 1)")
        self.learning_rate = float(learning_rate)
        self.sigma_decay = float(sigma_decay)
        self.elite_fraction = float(elite_fraction)
        self._center = center_init.to(DTYPE).clone()
        self._sigma = float(sigma)
        self._best_mean = -math.inf
        self._elites = torch.empty((0, self.dim), dtype=DTYPE)
        self.accepted: list[bool] = []

    def _num_elites(self) -> int:
        k = int(self._elites.shape[0])
        return k if (self.popsize - k) % 2 == 0 else k - 1

    def ask(self, generation: int) -> torch.Tensor:
        k = self._num_elites()
        pairs = (self.popsize - k) // 2
        eps = torch.randn((pairs, self.dim), dtype=DTYPE, generator=generator(self.seed, "ask", generation))
        fresh = torch.cat([self._center + self._sigma * eps, self._center - self._sigma * eps])
        return torch.cat([self._elites[:k], fresh]).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor) -> None:
        self._check_tell(values, fitness)
        values, fitness, ok = values.to(DTYPE), fitness.to(DTYPE), ok.to(torch.bool)
        mean_fitness = float(fitness.mean())
        if mean_fitness > self._best_mean:
            n_ok = int(ok.sum())
            if n_ok:
                eps = (values[ok] - self._center) / self._sigma
                grad = (fitness[ok][:, None] * eps).sum(0) / (n_ok * self._sigma)
                self._center = self._center + self.learning_rate * grad
            self._best_mean = mean_fitness
            self._elites = torch.empty((0, self.dim), dtype=DTYPE)
            self.accepted.append(True)
        else:
            keep = max(1, int(self.popsize * self.elite_fraction)) if self.elite_fraction > 0 else 0
            order = torch.argsort(fitness, descending=True, stable=True)[:keep]
            self._elites = values[order].clone()
            self.accepted.append(False)
        self._sigma *= self.sigma_decay

    @property
    def center(self) -> torch.Tensor:
        return self._center.clone()

    def state_dict(self) -> dict[str, Any]:
        return {
            "center": self._center.clone(),
            "sigma": self._sigma,
            "best_mean": self._best_mean,
            "elites": self._elites.clone(),
            "accepted": list(self.accepted),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._center = state["center"].to(DTYPE).clone()
        self._sigma = float(state["sigma"])
        self._best_mean = float(state["best_mean"])
        self._elites = state["elites"].to(DTYPE).clone()
        self.accepted = list(state["accepted"])
