"""The NM-GRPO-ES authors' rule (docs/method.md §3), behind the common interface.

Antithetic OpenAI-ES with raw fitness, step ``learning_rate``; sigma decays by ``sigma_decay`` every generation.
The step is ACCEPTED only if the population's mean fitness (failed members included at fitness_on_failure, late
members left out) beats the best mean so far; otherwise the centre stays and the top ``elite_fraction`` of members
are re-used in the next population (the rest are fresh antithetic pairs; one elite is dropped if needed to keep
the pairs whole).

Which members enter the gradient (the authors are silent; decided here): the complete fresh antithetic pairs only,
gradient = sum over pairs of (f+ - f-) / 2 * eps / (n_pairs * sigma). For complete pairs this IS the authors'
sum f_i eps_i / (N * sigma); what it excludes are the terms that formula gets wrong: an elite is a point sampled
around an earlier centre with no partner, and a lone half of a pair (its partner failed or late) has no partner
either, so their raw f * eps enters without the baseline the pair's difference provides, and the step grows with
the fitness level instead of its differences (measured: after one rejected generation at population 180, a step
of 0.506, 0.499 of it from 44 elites, against 0.070 from the 68 pairs). Elites still count in the acceptance mean.
Ties need no rule: raw differences of tied pairs are 0, so an all-tied generation moves nothing.

The step is the authors' (``learning_rate`` x the raw-fitness gradient), so how far it moves depends on the fitness's
scale; ``es.max_step_radii`` bounds the centre's move per generation (L2) at that many radii (the current sigma), so
a fitness on another scale, or a lucky pair, cannot throw the centre further than its samples reach. 2.0 is ClipUp's
top speed at pgpe's default step, and does not bind at the embedded default (a move of ~0.7 radii there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from meta.searchers.base import DTYPE, Searcher, SearcherSettings, setting
from meta.searchers.utilities import TellSummary, complete_pairs, measured, pair_note
from core.seeding import generator


@dataclass
class OpenAIESEliteSettings(SearcherSettings):
    """es=openai_es_elite's settings (conf/es/openai_es_elite.yaml composes on them as es/openai_es_elite_schema)."""

    sigma_decay: float = setting(0.99, "sigma (the radius) is multiplied by this every generation")
    learning_rate: float = setting(0.01, "the step: learning_rate x the raw-fitness gradient")
    elite_fraction: float = setting(0.25, "after a rejected step, this fraction of the members is re-used next "
                                          "generation, in [0, 1)")
    max_step_radii: Optional[float] = setting(2.0, "the centre's largest move per generation (L2), in radii (the "
                                                   "current sigma); null: none")


class OpenAIESEliteSearcher(Searcher):
    name = "openai_es_elite"
    settings_class = OpenAIESEliteSettings
    antithetic = True
    early_stop_reason = "OpenAI-ES weighs every member by its fitness: a stopped member has no final fitness"

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        radius: float,
        sigma_decay: float,
        learning_rate: float,
        elite_fraction: float,
        max_step_radii: float | None,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        if not 0.0 <= elite_fraction < 1.0:
            raise ValueError(f"es.elite_fraction={elite_fraction} must be in [0, 1)")
        if max_step_radii is not None and not float(max_step_radii) > 0:
            raise ValueError(f"es.max_step_radii={max_step_radii} must be above 0 (the centre's largest move per "
                             "generation, in radii), or null for none")
        self.max_step_radii = None if max_step_radii is None else float(max_step_radii)
        self.learning_rate = float(learning_rate)
        self.sigma_decay = float(sigma_decay)
        self.elite_fraction = float(elite_fraction)
        self._center = center_init.to(DTYPE).clone()
        self._sigma = float(radius)  # the authors' sigma, decayed each generation
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

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        self._check_tell(values, fitness)
        values, fitness, ok = values.to(DTYPE), fitness.to(DTYPE), ok.to(torch.bool)
        k = self._num_elites()  # the layout ask used: elites, then the plus halves, then the minus halves
        n_pairs = (self.popsize - k) // 2
        plus = torch.arange(k, k + n_pairs)
        pairs = complete_pairs(plus, plus + n_pairs, ok, late)
        note = pair_note(int(pairs.sum()), int((~pairs).sum()))
        present = measured(self.popsize, late)
        mean_fitness = float(fitness[present].mean()) if bool(present.any()) else -math.inf
        if mean_fitness > self._best_mean:
            if bool(pairs.any()):
                p, m = plus[pairs], plus[pairs] + n_pairs
                eps = (values[p] - self._center) / self._sigma
                diff = (fitness[p] - fitness[m]) / 2.0
                grad = (diff[:, None] * eps).sum(0) / (int(pairs.sum()) * self._sigma)
                step = self.learning_rate * grad
                if self.max_step_radii is not None:
                    limit = self.max_step_radii * self._sigma
                    norm = float(step.norm())
                    if norm > limit:
                        step = step * (limit / norm)
                        note += f"; step {norm / self._sigma:.2f} radii bounded at {self.max_step_radii:g}"
                self._center = self._center + step
            self._best_mean = mean_fitness
            self._elites = torch.empty((0, self.dim), dtype=DTYPE)
            self.accepted.append(True)
            note += f"; accepted (mean {mean_fitness:.4f})"
        else:
            keep = max(1, int(self.popsize * self.elite_fraction)) if self.elite_fraction > 0 else 0
            candidates = torch.nonzero(present).flatten()  # a late member has no fitness to be an elite by
            order = candidates[torch.argsort(fitness[candidates], descending=True, stable=True)][:keep]
            self._elites = values[order].clone()
            self.accepted.append(False)
            note += f"; rejected (mean {mean_fitness:.4f} <= best {self._best_mean:.4f}), {len(order)} elite(s) kept"
        self._sigma *= self.sigma_decay
        return TellSummary(used=int(present.sum()), dropped_pairs=int((~pairs).sum()), note=note)

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
