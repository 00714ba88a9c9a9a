"""PGPE (evotorch functional API, antithetic sampling, ClipUp by default): the default searcher.

evotorch's sampler interleaves the pairs (member 2i = centre + d_i, 2i+1 = centre - d_i). A tell uses the complete
pairs only (both halves ok and measured), ranks them with tie-averaged utilities (meta/searchers/utilities.py) and
hands evotorch those utilities as "raw"; with no complete pair or all utilities equal, the state is left as it was
(ClipUp's momentum included: a generation with no information does not move the centre).

The step is in radii (``es.step_radii``): ClipUp's step, the L2 norm of the centre's move per generation (its top
speed twice that), is ``step_radii x es.radius``, so a search at another radius moves as far in units of its own
samples. 1.0 was chosen on the family of unrolled problems (bench/bench_nres.py, docs/searchers.md): the best step
there was 1 radius on two problems and 2 on the third, 4 overshot every one, and the former absolute 0.005 (0.5 radii
at the default radius) was the slowest on all. ``es.center_learning_rate`` (absolute) overrides it; a search that
stored one resumes with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from meta.searchers.base import DTYPE, Searcher, SearcherSettings, setting
from meta.searchers.serialize import from_plain, to_plain
from meta.searchers.utilities import TellSummary, check_ranking, complete_pairs, pair_note, tie_averaged_utilities
from core.seeding import seeded_global_torch


#: es.step_radii's default for pgpe: chosen on the family of unrolled problems (the module docstring)
DEFAULT_STEP_RADII = 1.0


@dataclass
class PGPESettings(SearcherSettings):
    """es=pgpe's settings (conf/es/pgpe.yaml composes on them as es/pgpe_schema)."""

    step_radii: float = setting(DEFAULT_STEP_RADII, "ClipUp's step (the L2 norm of the centre's move per generation) "
                                                    "in units of es.radius")
    center_learning_rate: Optional[float] = setting(None, "the same step as an absolute number; null: step_radii x "
                                                          "es.radius")
    stdev_learning_rate: float = setting(0.1, "the learning rate of the search distribution's stdev")
    stdev_max_change: float = setting(0.2, "the largest relative change of the stdev per generation")
    ranking_method: str = setting("centered", "how fitnesses become utilities (ties averaged): centered | raw | ...")
    optimizer: str = setting("clipup", "evotorch's optimizer of the centre: clipup | adam | sgd")
    optimizer_config: dict[str, Any] = setting({}, "the optimizer's own settings (clipup momentum, adam betas)",
                                               added=True)


class PGPESearcher(Searcher):
    name = "pgpe"
    settings_class = PGPESettings
    imports = ("evotorch", "ray")  # evotorch imports ray at import time
    antithetic = True
    early_stop_reason = ("PGPE's update weighs every member by its centred rank within antithetic pairs: a stopped "
                         "member changes its pair's difference")

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        radius: float,
        step_radii: float,
        center_learning_rate: float | None,
        stdev_learning_rate: float,
        stdev_max_change: float,
        ranking_method: str,
        optimizer: str,
        optimizer_config: Mapping[str, Any] | None,
    ) -> None:
        super().__init__(center_init, popsize, seed)
        from evotorch.algorithms.functional import pgpe  # evotorch imports ray: keep it lazy

        self.ranking_method = check_ranking(self.name, str(ranking_method))
        if center_learning_rate is None:
            if not float(step_radii) > 0:
                raise ValueError(f"es.step_radii={step_radii} must be above 0 (ClipUp's step per generation, in radii)")
            center_learning_rate = float(step_radii) * float(radius)
        self._state = pgpe(
            center_init=center_init.to(DTYPE),
            center_learning_rate=float(center_learning_rate),
            stdev_learning_rate=float(stdev_learning_rate),
            objective_sense="max",
            ranking_method="raw",  # utilities come ranked, ties averaged (tell)
            optimizer=str(optimizer),
            optimizer_config=dict(optimizer_config or {}),
            stdev_init=float(radius),  # evotorch's name for the search radius
            stdev_max_change=float(stdev_max_change),
            symmetric=True,
        )

    def ask(self, generation: int) -> torch.Tensor:
        from evotorch.algorithms.functional import pgpe_ask

        with seeded_global_torch(self.seed, "ask", generation):
            return pgpe_ask(self._state, popsize=self.popsize).clone()

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        from evotorch.algorithms.functional import pgpe_tell

        self._check_tell(values, fitness)
        pairs = complete_pairs(torch.arange(0, self.popsize, 2), torch.arange(1, self.popsize, 2), ok, late)
        keep = pairs.repeat_interleave(2)
        kept, dropped = int(pairs.sum()), int((~pairs).sum())
        note = pair_note(kept, dropped)
        utilities = tie_averaged_utilities(fitness.to(DTYPE)[keep], self.ranking_method)
        if kept == 0 or not bool(utilities.any()):
            return TellSummary(used=2 * kept, dropped_pairs=dropped, no_information=True,
                               note=note + "; no information (no complete pair, or all tied): centre left as it was")
        state = self._state._replace(ranking_method="raw")  # states written before tie averaging said "centered"
        self._state = pgpe_tell(state, values.to(DTYPE)[keep], utilities)
        return TellSummary(used=2 * kept, dropped_pairs=dropped, note=note)

    @property
    def center(self) -> torch.Tensor:
        return self._state.optimizer_state.center.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"functional": to_plain(self._state)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._state = from_plain(state["functional"])
