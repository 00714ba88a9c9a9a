"""CMA-ES through the ``cma`` package's ask/tell.

cma's objects are not safely serialisable without pickle, so the state stored is what is needed to rebuild
one: the centre init, and every told generation's population and fitness. Rebuilding replays ask (numpy RNG
seeded from (seed, generation), exactly as the first time) to advance cma's internal state, then tells the
STORED population, so on the same machine a resumed search is bit-identical to an uninterrupted one.

Why the stored population and a tolerance, not a digest of the replay: cma's ask and tell run through
numpy/BLAS kernels that differ between CPUs (AVX2 vs AVX-512, Intel vs AMD), so a search started on one node
and resumed on another replays populations that differ in the last bits. Telling those would silently change
the search, and refusing them (a digest) would strand a multi-day search on one kind of node. A replayed
population further from the stored one than ``REPLAY_RTOL`` is a different algorithm (a changed cma version),
and is refused.

Late members are left out of cma's tell (it accepts fewer solutions than asked); failed ones keep
fitness_on_failure. Ties: cma ranks by its own sort, so partial ties are broken by position (its recombination
weights are per rank, with no per-solution weights in its API); a generation where every measured member scored the
same, or with fewer than two measured, is not told at all (no information: the distribution stays). Which members
were told is stored per generation (``told``), so the replay on resume tells exactly what the first run told.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from meta.searchers.base import DTYPE, Searcher, SearcherSettings, setting
from meta.searchers.utilities import TellSummary, all_tied, measured
from core.seeding import derive_seed, seeded_global_numpy

logger = logging.getLogger(__name__)


#: relative distance (Frobenius) between a replayed and a stored population still taken as the same draw:
#: kernel rounding gives ~1e-15 per generation, a changed algorithm gives O(1)
REPLAY_RTOL = 1e-6


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float64).tobytes()).hexdigest()


def _relative_distance(replayed: np.ndarray, stored: np.ndarray) -> float:
    if replayed.shape != stored.shape:
        return float("inf")
    return float(np.linalg.norm(replayed - stored) / max(np.linalg.norm(stored), 1e-300))


@dataclass
class CMAESSettings(SearcherSettings):
    """es=cmaes's settings (conf/es/cmaes.yaml composes on them as es/cmaes_schema)."""

    diagonal: bool = setting(False, "true: a diagonal covariance (CMA_diagonal) instead of the full one")


class CMAESSearcher(Searcher):
    name = "cmaes"
    settings_class = CMAESSettings
    imports = ("cma",)
    early_stop_reason = "CMA-ES gives the worst members negative weights (active covariance update): their order counts"

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        radius: float,
        diagonal: bool,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        self.center_init = center_init.to(DTYPE).clone()
        self.sigma_init = float(radius)  # cma's initial step size
        self.diagonal = bool(diagonal)
        self.history: list[torch.Tensor] = []
        self.populations: list[torch.Tensor] = []
        self.digests: list[str] = []
        self.told: list[torch.Tensor] = []  # per generation: the members told to cma (none: not told)
        self._es = self._fresh()
        self._asked: tuple[int, np.ndarray] | None = None

    def _fresh(self) -> Any:
        import cma

        options = {
            "popsize": self.popsize,
            "seed": derive_seed(self.seed, "cma-init") % (2**31 - 1) + 1,
            "verbose": -9,
            "verb_disp": 0,
            "verb_log": 0,
            "CMA_diagonal": self.diagonal,
        }
        with seeded_global_numpy(self.seed, "cma-init"):
            return cma.CMAEvolutionStrategy(self.center_init.numpy().copy(), self.sigma_init, options)

    def _ask_np(self, generation: int) -> np.ndarray:
        if self._asked is not None and self._asked[0] == generation:
            return self._asked[1]
        expected = sum(1 for mask in self.told if bool(mask.any()))  # generations told to cma so far
        if self._es.countiter != expected or len(self.told) != generation:
            raise RuntimeError(f"cmaes: asked generation {generation} but the state is at {len(self.told)} "
                               f"(cma iteration {self._es.countiter})")
        with seeded_global_numpy(self.seed, "ask", generation):
            values = np.array(self._es.ask(), dtype=np.float64)
        self._asked = (generation, values)
        return values

    def _tell_np(self, generation: int, values: np.ndarray, fitness: np.ndarray, told: np.ndarray) -> None:
        if told.any():
            with seeded_global_numpy(self.seed, "tell", generation):
                self._es.tell(list(values[told]), list(-fitness[told]))  # cma minimises
        self._asked = None

    def _told_mask(self, fitness: torch.Tensor, late: torch.Tensor | None) -> torch.Tensor:
        keep = measured(self.popsize, late)
        if int(keep.sum()) < 2 or all_tied(fitness[keep]):
            return torch.zeros(self.popsize, dtype=torch.bool)
        return keep

    def ask(self, generation: int) -> torch.Tensor:
        return torch.as_tensor(self._ask_np(generation).copy(), dtype=DTYPE)

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        self._check_tell(values, fitness)
        asked = self._ask_np(generation)
        if not np.array_equal(asked, values.numpy()):
            raise ValueError("cmaes.tell: the told population is not the one asked for this generation")
        told = self._told_mask(fitness.to(DTYPE), late)
        self._tell_np(generation, asked, fitness.to(DTYPE).numpy(), told.numpy())
        self.history.append(fitness.to(DTYPE).clone())
        self.populations.append(torch.as_tensor(asked.copy(), dtype=DTYPE))
        self.digests.append(_digest(asked))
        self.told.append(told)
        used = int(measured(self.popsize, late).sum())
        if not told.any():
            return TellSummary(used=used, no_information=True,
                               note=f"{used} measured member(s), all tied: not told to cma (no information)")
        return TellSummary(used=used, note=f"{used} measured member(s) told to cma")

    @property
    def center(self) -> torch.Tensor:
        return torch.as_tensor(np.array(self._es.mean, dtype=np.float64), dtype=DTYPE)

    def state_dict(self) -> dict[str, Any]:
        return {
            "center_init": self.center_init.clone(),
            "fitness_history": [f.clone() for f in self.history],
            "populations": [p.clone() for p in self.populations],
            "population_digests": list(self.digests),
            "told": [mask.clone() for mask in self.told],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.center_init = state["center_init"].to(DTYPE).clone()
        self._es = self._fresh()
        self._asked = None
        self.history, self.populations, self.digests, self.told = [], [], [], []
        # States written before populations were stored can only be checked bit for bit.
        stored = state.get("populations") or [None] * len(state["fitness_history"])
        # States written before late members and all-tied generations existed told every member.
        told_masks = state.get("told") or [torch.ones(self.popsize, dtype=torch.bool)] * len(state["fitness_history"])
        for generation, (fitness, population, digest, told) in enumerate(
            zip(state["fitness_history"], stored, state["population_digests"], told_masks)
        ):
            replayed = self._ask_np(generation)
            if population is None:
                if _digest(replayed) != digest:
                    raise ValueError(
                        f"cmaes: replaying generation {generation} gave a different population than the original "
                        "run (another cma version, or another CPU's numeric kernels); this state file predates "
                        "stored populations, so resume with the cma version and kind of machine it started on"
                    )
                values = replayed
            else:
                values = population.to(DTYPE).numpy()
                distance = _relative_distance(replayed, values)
                if distance > REPLAY_RTOL:
                    raise ValueError(
                        f"cmaes: replaying generation {generation} gave a population {distance:.2e} (relative) away "
                        f"from the stored one (tolerance {REPLAY_RTOL:g}): the cma package's algorithm changed; "
                        "resume with the cma version the run started with"
                    )
                if distance > 0:
                    logger.info("cmaes: generation %d replayed %.1e (relative) from the stored population "
                                "(another CPU's kernels); continuing from the stored one", generation, distance)
            self._tell_np(generation, values, fitness.to(DTYPE).numpy(), told.to(torch.bool).numpy())
            self.history.append(fitness.to(DTYPE).clone())
            self.populations.append(torch.as_tensor(values.copy(), dtype=DTYPE))
            self.digests.append(digest)
            self.told.append(told.to(torch.bool).clone())
