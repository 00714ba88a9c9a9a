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
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import logging

import torch

from meta.searchers.base import DTYPE, MemberWork, Searcher, SearcherSettings, setting
from meta.searchers.serialize import from_plain, to_plain
from meta.searchers.utilities import TellSummary
from core.config.horizon import MEMBER_STEPS_KEY
from core.seeding import generator

logger = logging.getLogger(__name__)

#: truncation_steps null: the run cut into this many pieces (the NM-GRPO-ES authors' T = 100 of a 1,600-step run)
DEFAULT_PIECES = 16
#: what a pair's halves did in a generation, as the tell reads it: both ok, one failed, one unmeasured
ADVANCE, RESTART, STAY = "advance", "restart", "stay"
#: the default update: plain steps along the standardised direction (each truncation's pair difference divided by the
#: RMS of whole runs' pair differences over the last episode), so that ``step_radii`` is the centre's move per
#: episode in radii at a clear signal, whatever the fitness's scale
STANDARDIZED = "standardized"
#: es.update: "run" moves the centre by each pair's whole-run difference when its run ends (the truncations'
#: changes summed: no partial-run step, no cycle); "truncation" by every truncation's change (the papers' online step)
RUN_UPDATE, TRUNCATION_UPDATE = "run", "truncation"
UPDATES = (RUN_UPDATE, TRUNCATION_UPDATE)
#: the updates es.optimizer may name: the default, or evotorch's functional optimizers on the same direction
OPTIMIZERS = (STANDARDIZED, "sgd", "clipup", "adam")
#: es.step_radii's default: chosen on the family of unrolled problems (bench/bench_nres.py, docs/searchers.md)
DEFAULT_STEP_RADII = 1.5
#: a pair unmeasured this many generations in a row (late at the quorum, no node could run it) starts a new run
LATE_RESTART = 2
#: above this share of pairs with a failed half in one generation, the tell warns
FAILURE_WARNING_RATE = 0.1


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


@dataclass
class NRESSettings(SearcherSettings):
    """es=nres's settings (conf/es/nres.yaml composes on them as es/nres_schema)."""

    horizon_steps: int = setting("${train.steps}", "a particle's run; must equal train.steps (the exported run: its "
                                                   "schedule, its score)")
    truncation_steps: Optional[int] = setting(None, f"steps per truncation; null: train.steps / {DEFAULT_PIECES} "
                                                    "rounded up (the authors' T = 100 of 1,600)")
    stagger: bool = setting(True, "true: pairs' runs start spread over the run's pieces, so every update mixes all "
                                  "phases; false: all start and restart together")
    update: str = setting(RUN_UPDATE, "run: the centre moves by each pair's whole-run difference (its truncations' "
                                      "changes summed) when that run ends; truncation: by every truncation's change "
                                      "(the papers' step)")
    step_radii: float = setting(DEFAULT_STEP_RADII, "the centre's move per episode (one run of every particle), in "
                                                    "units of es.radius, at a clear signal; less where the pairs' "
                                                    "differences disagree with their noise")
    optimizer: str = setting(STANDARDIZED, "standardized: steps along the standardised direction; sgd, clipup, adam: "
                                           "evotorch's, at step_radii x radius")
    optimizer_config: dict[str, Any] = setting({}, "an evotorch optimizer's own settings (adam beta1/beta2/epsilon, "
                                                   "clipup momentum)")
    average: bool = setting(True, "keep the mean centre over the last episode (Polyak), a candidate at selection")
    ranking_method: str = setting("raw", "the changes themselves: ranks would not add up over a run (others refused)")


class NRESSearcher(Searcher):
    name = "nres"
    settings_class = NRESSettings
    antithetic = True
    online = True
    imports = ("evotorch", "ray")  # the functional optimizers; evotorch imports ray at import time
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
        stagger: bool = True,
        step_radii: float = DEFAULT_STEP_RADII,
        optimizer: str = STANDARDIZED,
        optimizer_config: Mapping[str, Any] | None = None,
        update: str = RUN_UPDATE,
        average: bool = True,
        ranking_method: str = "raw",
    ) -> None:
        super().__init__(center_init, popsize, seed)
        self.horizon = int(horizon_steps)
        if self.horizon < 1:
            raise ValueError(f"es.horizon_steps={horizon_steps} (train.steps) must be at least 1 for es=nres")
        if truncation_steps is not None and not 1 <= int(truncation_steps) <= self.horizon:
            raise ValueError(f"es.truncation_steps={truncation_steps} must be between 1 and the run's "
                             f"train.steps={self.horizon} (null: train.steps/{DEFAULT_PIECES})")
        if float(radius) <= 0:
            raise ValueError(f"es.radius={radius} must be above 0 (the radius of each particle's noise)")
        if not float(step_radii) > 0:
            raise ValueError(f"es.step_radii={step_radii} must be above 0 (the centre's move per update, in radii)")
        if str(ranking_method) != "raw":
            raise ValueError(f"es.ranking_method={ranking_method!r} does not apply to es=nres: ranks of a truncation's "
                             "changes do not add up over a run as the changes do, so the updates would no longer "
                             "estimate the gradient of the run's final score; set es.ranking_method=raw")
        if str(optimizer) not in OPTIMIZERS:
            raise ValueError(f"es.optimizer={optimizer!r} is not one of {OPTIMIZERS} for es=nres")
        self.length = truncation_length(self.horizon, truncation_steps)
        self.pieces = math.ceil(self.horizon / self.length)
        self.sigma = float(radius)
        self.optimizer_name = str(optimizer)
        if str(update) not in UPDATES:
            raise ValueError(f"es.update={update!r} is not one of {UPDATES} for es=nres")
        self.update = str(update)
        self.average = bool(average)
        rate = float(step_radii) * self.sigma
        center = center_init.to(DTYPE)
        if self.optimizer_name == STANDARDIZED:
            self._center = center.clone()
            self._rate = rate
            self._opt = None
        else:
            from evotorch.algorithms.functional.misc import get_functional_optimizer

            self._functional = get_functional_optimizer(self.optimizer_name)
            self._opt = self._functional.initialize(center_init=center, center_learning_rate=rate,
                                                    **dict(optimizer_config or {}))
        pairs = self.popsize // 2
        self._step = [0] * pairs
        self._stop = first_stops(pairs, self.horizon, self.length, bool(stagger))
        self._episode = [0] * pairs
        self._late = [0] * pairs
        #: per pair, the sum of its halves' half-differences over its run so far (the run's pair difference once the
        #: run ends), and the [update, difference] of the runs that ended within the last episode's updates: their RMS
        #: is the scale that standardises every truncation's difference alike, so an episode's updates add up to one
        #: standardised whole-run step
        self._run_difference = [0.0] * pairs
        self._ended: list[list[float]] = []
        self._updates = 0
        self._episode_ended = [False] * pairs
        self._last_run: dict[int, float] = {}
        #: the centres after each update of the last episode (Polyak's average is their mean)
        self._recent = center.clone()[None, :]

    @classmethod
    def search_refusal(cls, settings: Mapping[str, Any], train_steps: int, member_steps: int,
                       seeds_per_member: int) -> str | None:
        """A particle's run is the exported run (its schedule, its final pass@1), trained a truncation at a time on
        one seed with one checkpoint: no member steps of its own, no horizon but train.steps, one seed."""
        if member_steps != train_steps:
            return (f"es.{MEMBER_STEPS_KEY}={member_steps} does not apply to es={cls.name}: its particles train the "
                    f"whole train.steps={train_steps}, a truncation at a time (es.truncation_steps); set "
                    f"es.{MEMBER_STEPS_KEY}=null")
        horizon = settings.get("horizon_steps")
        if horizon is not None and int(horizon) != train_steps:
            return (f"es.horizon_steps={horizon} must equal train.steps={train_steps} for es={cls.name}: a particle's "
                    "run is the run the export is for (its schedule, its final pass@1); drop es.horizon_steps (it "
                    "follows train.steps) or set train.steps")
        if seeds_per_member > 1:
            return (f"seeds_per_member={seeds_per_member} does not apply to es={cls.name}: a particle is one training "
                    "run with one checkpoint; set seeds_per_member=1 (a larger population averages more runs)")
        return None

    @classmethod
    def planned_member_steps(cls, settings: Mapping[str, Any], population: int, generations: int) -> int | None:
        return planned_steps(population, generations, int(settings["horizon_steps"]),
                             settings.get("truncation_steps"), bool(settings.get("stagger", True)))

    @classmethod
    def longest_member_steps(cls, settings: Mapping[str, Any]) -> int | None:
        horizon = int(settings["horizon_steps"])
        if bool(settings.get("stagger", True)):  # a staggered pair's first truncation can span nearly the whole run
            return horizon
        return truncation_length(horizon, settings.get("truncation_steps"))

    @classmethod
    def steady_member_steps(cls, settings: Mapping[str, Any]) -> int | None:
        return truncation_length(int(settings["horizon_steps"]), settings.get("truncation_steps"))

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

    def member_work(self, steps: int) -> list[MemberWork]:
        """Each member's truncation of its pair's run; a particle's run has one seed over all its truncations, and
        the halves of a pair share it."""
        return [MemberWork(piece["start"], piece["stop"], piece["horizon"], run=(piece["particle"], piece["episode"]),
                           seed_key=("particle", piece["particle"] // 2, piece["episode"]))
                for piece in self.truncations()]

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
        """A pair with both halves measured enters the update; a failed half is charged: its change is the
        ``fitness_on_failure`` the orchestrator gave it, its partner's is measured, and the pair's run ends."""
        self._check_tell(values, fitness)
        pairs_n = self.popsize // 2
        measured = [True] * self.popsize if late is None else [not v for v in late.to(torch.bool).tolist()]
        fine = ok.to(torch.bool).tolist()
        both_measured = [measured[2 * p] and measured[2 * p + 1] for p in range(pairs_n)]
        outcome = [ADVANCE if both_measured[p] and fine[2 * p] and fine[2 * p + 1]
                   else RESTART if any(measured[i] and not fine[i] for i in (2 * p, 2 * p + 1)) else STAY
                   for p in range(pairs_n)]
        # a charged pair (one half failed, both measured) counts with its failure's change; both failed: no difference
        used = torch.tensor([both_measured[p] and (fine[2 * p] or fine[2 * p + 1]) for p in range(pairs_n)],
                            dtype=torch.bool)
        note = self._move(outcome)
        kept = int(used.sum())
        charged = sum(1 for p in range(pairs_n) if outcome[p] == RESTART and bool(used[p]))
        note = (f"{kept} measured antithetic pair(s)" + (f", {charged} charged a failed half's change" if charged
                                                        else "") + note)
        if charged and charged / pairs_n > FAILURE_WARNING_RATE:
            logger.warning("es=nres generation %d: %d of %d pairs had a failed half (charged fitness_on_failure as "
                           "its change, its run restarted): above %.0f%%, failures shape the search", generation,
                           charged, pairs_n, 100 * FAILURE_WARNING_RATE)
        first, second = torch.arange(0, self.popsize, 2)[used], torch.arange(1, self.popsize, 2)[used]
        difference = (fitness.to(DTYPE)[first] - fitness.to(DTYPE)[second]) / 2.0
        self._record_runs(used, difference)
        if kept == 0:
            return TellSummary(used=0, dropped_pairs=pairs_n, no_information=True,
                               note=note + "; no measured pair: centre left as it was")
        scale = self._scale(difference)
        if scale == 0.0:
            return TellSummary(used=2 * kept, dropped_pairs=pairs_n - kept, no_information=True,
                               note=note + "; every pair's halves changed alike: centre left as it was")
        unit_noise = (values[first] - values[second]).to(DTYPE) / (2.0 * self.sigma)
        if self.update == RUN_UPDATE:  # each pair whose run ended now, with its whole run's difference
            ended = [self._last_run.get(pair) for pair in torch.nonzero(used).flatten().tolist()]
            whole = torch.tensor([0.0 if value is None else value for value in ended], dtype=DTYPE)
            if not any(value is not None for value in ended):
                return TellSummary(used=2 * kept, dropped_pairs=pairs_n - kept,
                                   note=note + "; no pair's run ended: centre unchanged this generation")
            direction = ((whole / scale)[:, None] * unit_noise).sum(0) / pairs_n
        else:  # every pair, with its truncation's difference (the papers' step after every truncation)
            direction = ((difference / scale)[:, None] * unit_noise).sum(0) / kept
        self._apply(direction)
        return TellSummary(used=2 * kept, dropped_pairs=pairs_n - kept, note=note)

    def _record_runs(self, used: torch.Tensor, difference: torch.Tensor) -> None:
        """Add this update's differences to their pairs' runs; a run that ended now joins the window of ended runs
        (the last episode's updates), and its pair starts a new sum."""
        self._updates += 1
        self._last_run = {}
        for value, pair in zip(difference.tolist(), torch.nonzero(used).flatten().tolist()):
            self._run_difference[pair] += value
            if self._episode_ended[pair]:
                self._last_run[pair] = self._run_difference[pair]
                self._ended.append([float(self._updates), self._run_difference[pair]])
        for pair, ended in enumerate(self._episode_ended):
            if ended:
                self._run_difference[pair] = 0.0
        self._ended = [entry for entry in self._ended if entry[0] > self._updates - self.pieces]

    def _scale(self, difference: torch.Tensor) -> float:
        """The RMS of whole runs' pair differences that ended within the last episode's updates; before any run
        has ended, the independent-phases guess sqrt(pieces) x this update's RMS."""
        if self._ended:
            return math.sqrt(sum(d * d for _, d in self._ended) / len(self._ended))
        return math.sqrt(self.pieces * float((difference ** 2).mean()))

    def _apply(self, direction: torch.Tensor) -> None:
        """Move the centre along the standardised direction (``step_radii`` radii at a perfectly clear signal) and
        keep it for the average over the last episode."""
        if self._opt is None:
            self._center = self._center + self._rate * direction
        else:
            self._opt = self._functional.tell(self._opt, follow_grad=direction)
        self._recent = torch.cat([self._recent, self.center[None, :]])[-self.pieces:]

    def _move(self, outcome: list[str]) -> str:
        """Each pair to its next truncation (a new run with new noise at the horizon, after a failure, or when late
        LATE_RESTART times in a row); the note."""
        late_restarts = 0
        self._episode_ended = [False] * len(outcome)
        for pair, what in enumerate(outcome):
            if what == STAY:
                self._late[pair] += 1
                if self._late[pair] < LATE_RESTART:
                    continue
                late_restarts += 1
                what = RESTART
            self._late[pair] = 0
            if what == RESTART or self._stop[pair] >= self.horizon:
                self._episode_ended[pair] = True
                self._episode[pair] += 1
                self._step[pair] = 0
            else:
                self._step[pair] = self._stop[pair]
            self._stop[pair] = min(self.horizon, self._step[pair] + self.length)
        restarts, stays = outcome.count(RESTART), outcome.count(STAY) - late_restarts
        return ((f"; {restarts} pair(s) with a failed half start a new run" if restarts else "")
                + (f"; {stays} pair(s) with an unmeasured half repeat their truncation" if stays else "")
                + (f"; {late_restarts} pair(s) unmeasured {LATE_RESTART} times in a row start a new run"
                   if late_restarts else ""))

    @property
    def center(self) -> torch.Tensor:
        if self._opt is None:
            return self._center.clone()
        return self._functional.ask(self._opt).clone()

    @property
    def averaged_center(self) -> torch.Tensor | None:
        """The mean of the centres over the last episode's updates (Polyak): the moving centre's cycle averaged
        out; None with ``es.average=false``."""
        return self._recent.mean(0) if self.average else None

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": to_plain(self._opt) if self._opt is not None else None,
                "center": self._center.clone() if self._opt is None else None,
                "step": list(self._step), "stop": list(self._stop), "episode": list(self._episode),
                "late": list(self._late), "run_difference": list(self._run_difference),
                "ended": [list(v) for v in self._ended], "updates": self._updates,
                "recent": self._recent.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._opt is None:
            self._center = state["center"].to(DTYPE).clone()
        else:
            self._opt = from_plain(state["optimizer"])
        self._step = [int(v) for v in state["step"]]
        self._stop = [int(v) for v in state["stop"]]
        self._episode = [int(v) for v in state["episode"]]
        self._late = [int(v) for v in state["late"]]
        self._run_difference = [float(v) for v in state["run_difference"]]
        self._ended = [[float(a), float(b)] for a, b in state["ended"]]
        self._updates = int(state["updates"])
        self._recent = state["recent"].to(DTYPE).clone()
