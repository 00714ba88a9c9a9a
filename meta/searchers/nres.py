"""Noise-Reuse ES (Li et al., NeurIPS 2023; ES-Single, Vicol et al. 2023, is the same estimator): an online ES whose
members are pieces of long runs, so a search costs about one training run per particle instead of one per member.

Each antithetic pair of particles (members 2p and 2p+1, interleaved as pgpe's) is one training run of
``horizon_steps`` steps per half, cut into truncations of ``truncation_steps``. A generation trains every pair's next
truncation from the pair's checkpoints, with the current centre plus the pair's noise, +eps for 2p and -eps for 2p+1
(the map set at the truncation's start); a pair keeps its noise until its run ends, then starts a new run with new
noise. Fitness is the change of validation pass@1 over the truncation, so a run's fitnesses telescope to its final
pass@1 minus the start's: the update after every truncation estimates the gradient of the full run's final score, with
no short-horizon bias (docs/searchers.md). The centre moves by an evotorch functional optimizer (Adam by default)
along g = sum over complete pairs of (u+ - u-)/2 eps / (n sigma^2), u the tie-averaged utilities of
``ranking_method`` ("raw": the deltas themselves, the papers' estimator).

Pairs progress together: both halves ok -> the pair moves to its next truncation; a half that failed after its
retries ends the pair's run (a new run with new noise); a half with no measurement (late at the quorum, or no node
could run it) leaves the pair at its boundary: both halves run the truncation again next generation from the same
checkpoints (so the pair stays antithetic), and the pair is left out of this update. ``stagger``: pairs' runs start at
steps spread over the run (pair p of n's first truncation runs from 0 to (p x pieces // n + 1) x truncation_steps), so one
generation's truncations cover every part of a run, as the papers recommend; false (the default, measured better on
the synthetic unrolled problem: bench/bench_nres.py): every pair starts at step 0 and restarts together, as evosax's
NoiseReuseES does.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from meta.searchers.base import DTYPE, Searcher
from meta.searchers.serialize import from_plain, to_plain
from meta.searchers.utilities import TellSummary, check_ranking, complete_pairs, pair_note, tie_averaged_utilities
from core.seeding import generator

#: truncation_steps null: the run cut into this many pieces (the NM-GRPO-ES authors' T = 100 of a 1,600-step run)
DEFAULT_PIECES = 16
#: what a pair's halves did in a generation, as the tell reads it: both ok, one failed, one unmeasured
ADVANCE, RESTART, STAY = "advance", "restart", "stay"


def truncation_length(horizon: int, truncation_steps: int | None) -> int:
    """The steps of one truncation: ``truncation_steps``, or the horizon / DEFAULT_PIECES rounded up."""
    if truncation_steps is None:
        return max(1, math.ceil(horizon / DEFAULT_PIECES))
    return int(truncation_steps)


def first_stops(pairs: int, horizon: int, length: int, stagger: bool) -> list[int]:
    """Each pair's first stop: one truncation in, or (stagger) evenly spread over the run's pieces, so that every
    generation's pairs stand at phases spread over the whole run."""
    pieces = math.ceil(horizon / length)
    return [min(horizon, ((p * pieces) // pairs + 1 if stagger else 1) * length) for p in range(pairs)]


def planned_steps(population: int, generations: int, horizon: int, truncation_steps: int | None,
                  stagger: bool) -> int:
    """Member-steps of ``generations`` generations when no truncation fails or is late (the dry-run plan's figure):
    every member trains its pair's truncations, restarting at the horizon."""
    length = truncation_length(horizon, truncation_steps)
    total = 0
    for stop in first_stops(population // 2, horizon, length, stagger):
        step = 0
        for _ in range(generations):
            total += 2 * (stop - step)
            step = 0 if stop >= horizon else stop
            stop = min(horizon, step + length)
    return total


class NRESSearcher(Searcher):
    name = "nres"
    antithetic = True
    online = True
    imports = ("evotorch", "ray")  # the functional optimizers and rankers; evotorch imports ray at import time
    early_stop_reason = "its update reads every pair's change over the truncation, and each pair's run goes on"

    def __init__(
        self,
        center_init: torch.Tensor,
        popsize: int,
        seed: int,
        *,
        horizon_steps: int,
        truncation_steps: int | None = None,
        radius: float,
        stagger: bool = False,
        center_learning_rate: float = 0.02,
        optimizer: str = "adam",
        optimizer_config: Mapping[str, Any] | None = None,
        ranking_method: str = "raw",
    ) -> None:
        super().__init__(center_init, popsize, seed)
        from evotorch.algorithms.functional.misc import get_functional_optimizer

        self.horizon = int(horizon_steps)
        if self.horizon < 1:
            raise ValueError(f"es.horizon_steps={horizon_steps} (train.steps) must be at least 1 for es=nres")
        if truncation_steps is not None and not 1 <= int(truncation_steps) <= self.horizon:
            raise ValueError(f"es.truncation_steps={truncation_steps} must be between 1 and the run's "
                             f"train.steps={self.horizon} (null: train.steps/{DEFAULT_PIECES})")
        if float(radius) <= 0:
            raise ValueError(f"es.radius={radius} must be above 0 (the radius of each particle's noise)")
        self.length = truncation_length(self.horizon, truncation_steps)
        self.sigma = float(radius)
        self.ranking_method = check_ranking(self.name, str(ranking_method))
        self.optimizer = get_functional_optimizer(str(optimizer))
        self._opt = self.optimizer.initialize(center_init=center_init.to(DTYPE),
                                              center_learning_rate=float(center_learning_rate),
                                              **dict(optimizer_config or {}))
        pairs = self.popsize // 2
        self._step = [0] * pairs
        self._stop = first_stops(pairs, self.horizon, self.length, bool(stagger))
        self._episode = [0] * pairs

    @classmethod
    def planned_member_steps(cls, settings: Mapping[str, Any], population: int, generations: int) -> int | None:
        return planned_steps(population, generations, int(settings["horizon_steps"]),
                             settings.get("truncation_steps"), bool(settings.get("stagger", False)))

    @classmethod
    def longest_member_steps(cls, settings: Mapping[str, Any]) -> int | None:
        horizon = int(settings["horizon_steps"])
        if bool(settings.get("stagger", False)):  # a staggered pair's first truncation can span nearly the whole run
            return horizon
        return truncation_length(horizon, settings.get("truncation_steps"))

    # ------------------------------------------------------------ particles
    def _noise(self, pair: int, episode: int) -> torch.Tensor:
        """The pair's noise for its run number ``episode``: a pure function of (seed, pair, episode)."""
        return self.sigma * torch.randn(self.dim, generator=generator(self.seed, "nres-noise", pair, episode),
                                        dtype=DTYPE)

    def truncations(self) -> list[dict[str, int]]:
        """Per population member, the piece of its pair's run the next generation trains (the orchestrator adds
        the particle's folder): {particle, episode, start, stop, horizon}."""
        return [{"particle": i, "episode": self._episode[i // 2], "start": self._step[i // 2],
                 "stop": self._stop[i // 2], "horizon": self.horizon} for i in range(self.popsize)]

    def kept_boundaries(self) -> list[tuple[int, int]]:
        """Per member, the (episode, step) of the checkpoint its particle stands on: the one to keep."""
        return [(self._episode[i // 2], self._step[i // 2]) for i in range(self.popsize)]

    # ------------------------------------------------------------ ask / tell
    def ask(self, generation: int) -> torch.Tensor:
        center = self.center
        rows = []
        for pair in range(self.popsize // 2):
            eps = self._noise(pair, self._episode[pair])
            rows += [center + eps, center - eps]
        return torch.stack(rows)

    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> TellSummary:
        self._check_tell(values, fitness)
        first, second = torch.arange(0, self.popsize, 2), torch.arange(1, self.popsize, 2)
        pairs = complete_pairs(first, second, ok, late)
        measured = torch.ones(self.popsize, dtype=torch.bool) if late is None else ~late.to(torch.bool)
        failed = ~ok.to(torch.bool) & measured
        outcome = [ADVANCE if bool(pairs[p]) else RESTART if bool(failed[2 * p] | failed[2 * p + 1]) else STAY
                   for p in range(self.popsize // 2)]
        kept, dropped = int(pairs.sum()), int((~pairs).sum())
        note = pair_note(kept, dropped) + self._move(outcome)
        utilities = tie_averaged_utilities(fitness.to(DTYPE)[pairs.repeat_interleave(2)], self.ranking_method)
        if kept == 0 or not bool(utilities.any()):
            return TellSummary(used=2 * kept, dropped_pairs=dropped, no_information=True,
                               note=note + "; no information (no complete pair, or all tied): centre left as it was")
        eps = (values[first][pairs] - values[second][pairs]).to(DTYPE) / 2.0
        weights = (utilities[0::2] - utilities[1::2]) / 2.0
        gradient = (weights[:, None] * eps).sum(0) / (kept * self.sigma ** 2)
        self._opt = self.optimizer.tell(self._opt, follow_grad=gradient)
        return TellSummary(used=2 * kept, dropped_pairs=dropped, note=note)

    def _move(self, outcome: list[str]) -> str:
        """Each pair to its next truncation (a new run with new noise at the horizon or after a failure); the note."""
        for pair, what in enumerate(outcome):
            if what == STAY:
                continue
            if what == RESTART or self._stop[pair] >= self.horizon:
                self._episode[pair] += 1
                self._step[pair] = 0
            else:
                self._step[pair] = self._stop[pair]
            self._stop[pair] = min(self.horizon, self._step[pair] + self.length)
        restarts, stays = outcome.count(RESTART), outcome.count(STAY)
        return ((f"; {restarts} pair(s) with a failed half start a new run" if restarts else "")
                + (f"; {stays} pair(s) with an unmeasured half repeat their truncation" if stays else ""))

    @property
    def center(self) -> torch.Tensor:
        return self.optimizer.ask(self._opt).clone()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": to_plain(self._opt), "step": list(self._step), "stop": list(self._stop),
                "episode": list(self._episode)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._opt = from_plain(state["optimizer"])
        self._step = [int(v) for v in state["step"]]
        self._stop = [int(v) for v in state["stop"]]
        self._episode = [int(v) for v in state["episode"]]
