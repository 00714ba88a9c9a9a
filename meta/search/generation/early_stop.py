"""Stopping clear losers early inside a generation, only where the searcher's update does not change.

Why: a real generation is 180 multi-hour GPU runs, and every member runs to its last step even when its early
validation already places it, beyond noise, in the part of the population the update ignores. SNES with
``ranking_method: nes`` gives every member in the bottom floor(N/2) ranks the same utility (evotorch's ``nes``
weights are 0 there before the shared shift), and CEM never uses a non-parent. So a member stopped early and ranked
at the very bottom leaves the update exactly as the full run would have made it, *when the early decision is
right*: its final fitness would have been strictly below the fitness of the lowest member the update weighs
(a tie with that member would have averaged utilities across the boundary; that case is not exact). Searchers
whose update reads every member (PGPE's centred ranks over antithetic pairs, OpenAI-ES's raw fitness, CMA-ES's
negative weights) refuse early stopping up front: `early_stop_refusal` says why.

The rule, per generation: at step ``at_fraction x train.steps`` (an intermediate validation step,
``train.eval_every``) a population member is decided once it has reported its score there, against the median of
the scores reported there so far, and only once at least ``min_reported x population`` members have reported
(members start and report at different times under array limits and queues). It is stopped when its score is
below that median by more than ``margin x noise``, ``noise`` being the standard deviation of an early score
across seeds of one init (meta.pilot measures it). At most the update's bottom size is ever stopped. A decision
is final: a kept member is not looked at again. The control member and re-evaluation runs are never stopped and
never count; with ``seeds_per_member`` > 1 the member's mean over its seeds decides, once every seed reported.

Every decision is written to ``early_stop.json`` in the generation directory before any cancellation, so a
restarted orchestrator settles the same members as stopped and decides only the members not decided yet.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from meta.search.generation.generation_shape import GenerationShape
# the early_stop node is the settings' (meta/settings/early_stop.py); read here as the rule's callers name it
from meta.settings.early_stop import EarlyStopConfig as EarlyStopConfig, EarlyStopError as EarlyStopError
from results.store.member_files import read_intermediate
from results.store.layout import seed_dir_name
from core.records import STOPPED_EARLY

#: the status of a member stopped by this rule (owned by core/records.py)
STOPPED_STATUS = STOPPED_EARLY


def early_stop_refusal(es: Mapping[str, Any]) -> str | None:
    """Why this searcher's update would change when bottom members stop early (None: it would not); each searcher
    class declares it (meta/searchers/base.py: early_stop, early_stop_refusal)."""
    from meta.searchers import searcher_class, searchers

    name = str(es.get("name"))
    refusal = searcher_class(name).early_stop_refusal(es)
    if refusal is None or refusal.startswith(f"es={name} "):
        return refusal
    exact = " and ".join(f"es={n} ({cls.early_stop.when})" for n, cls in searchers().items() if cls.early_stop)
    return f"es={name}: {refusal}; early stopping is exact only for {exact}"


def decision_step(config: EarlyStopConfig, steps: int, every: int | None) -> int:
    """The training step the decision is taken at, of a member that trains ``steps`` steps validating every
    ``every`` (train.eval_every); EarlyStopError when no intermediate validation happens there."""
    if not every:
        raise EarlyStopError("early_stop needs intermediate validation: set train.eval_every (e.g. "
                             f"train.eval_every={max(1, round(config.at_fraction * steps))})")
    step = round(config.at_fraction * steps)
    if step < 1 or step >= steps or step % int(every):
        raise EarlyStopError(
            f"early_stop.at_fraction={config.at_fraction} x train.steps={steps} is step {step}, which is not an "
            f"intermediate validation step (train.eval_every={every}, before the last step); choose eval_every "
            f"dividing {step} or another fraction")
    return step


def check_early_stop(config: EarlyStopConfig, es: Mapping[str, Any], member_steps: int, eval_every: int | None,
                     shape: GenerationShape) -> int | None:
    """Validate an enabled early_stop against the search (``shape``: its generations); the decision step (None when
    disabled)."""
    if not config.enabled:
        return None
    refusal = early_stop_refusal(es)
    if refusal:
        raise EarlyStopError(f"early_stop.enabled=true is refused: {refusal}")
    if config.noise is None or not config.noise > 0.0 or not math.isfinite(config.noise):
        raise EarlyStopError(
            f"early_stop.noise={config.noise} must be a positive number: the spread of an early score across seeds "
            "of one init, which `python -m meta.pilot ... train.eval_every=<k>` measures")
    if shape.early_stop_capacity < 1:
        raise EarlyStopError(f"population={shape.population} leaves no member the update ignores: nothing can stop")
    return decision_step(config, member_steps, eval_every)


@dataclass(frozen=True)
class Decision:
    """One member's early decision: stopped or kept, and what it was decided on."""

    index: int
    stop: bool
    score: float
    median: float
    reported: int

    def to_dict(self) -> dict[str, Any]:
        return {"stop": self.stop, "score": self.score, "median": self.median, "reported": self.reported}


@dataclass
class EarlyStopJudge:
    """Decides members one by one as their scores at the decision step arrive; explicit state (``decisions``),
    restored from the generation's early_stop.json on a restart."""

    config: EarlyStopConfig
    step: int
    #: the generation: who is a population member, and how many may stop (early_stop_capacity)
    shape: GenerationShape
    decisions: dict[int, Decision] = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        return self.shape.early_stop_capacity

    @property
    def threshold(self) -> float:
        return self.config.margin * float(self.config.noise or 0.0)

    def stopped(self) -> list[int]:
        return sorted(i for i, d in self.decisions.items() if d.stop)

    def decide(self, scores: Mapping[int, float], open_members: Collection[int]) -> list[Decision]:
        """New decisions from the scores reported so far at the decision step (member index -> score). Every
        reported population member counts in the median (finished ones and those decided before too); only
        ``open_members`` (still queued or running, not decided yet) get a decision. Lowest scores first, so the
        capacity goes to the clearest losers."""
        reported = {i: float(s) for i, s in scores.items() if self.shape.is_member(i)}
        reported.update({i: d.score for i, d in self.decisions.items()})
        if len(reported) < self.shape.share(self.config.min_reported):
            return []
        median = statistics.median(reported.values())
        stopped = len(self.stopped())
        new = []
        for index, score in sorted(reported.items(), key=lambda item: (item[1], item[0])):
            if index in self.decisions or index not in open_members:
                continue
            stop = score < median - self.threshold and stopped < self.capacity
            stopped += stop
            decision = Decision(index, stop, score, float(median), len(reported))
            self.decisions[index] = decision
            new.append(decision)
        return new

    def to_dict(self) -> dict[str, Any]:
        """The early_stop.json record: the rule's settings and every decision so far."""
        return {
            "step": self.step, "margin": self.config.margin, "noise": self.config.noise,
            "min_reported": self.config.min_reported, "capacity": self.capacity,
            "decisions": {str(i): d.to_dict() for i, d in sorted(self.decisions.items())},
        }

    def load(self, record: Mapping[str, Any]) -> None:
        """Restore the decisions a previous process wrote (early_stop.json), refusing one taken at another step."""
        if int(record.get("step", -1)) != self.step:
            raise EarlyStopError(f"early_stop.json was decided at step {record.get('step')}, this search decides at "
                                 f"step {self.step}: a resume may not change early_stop.at_fraction or train.steps")
        self.decisions = {
            int(i): Decision(int(i), bool(d["stop"]), float(d["score"]), float(d["median"]), int(d["reported"]))
            for i, d in (record.get("decisions") or {}).items()
        }


def reported_score(work_dir: str | Path, step: int, seeds: int) -> float | None:
    """A member's score at ``step``: its intermediate.jsonl value, or with several seeds the mean over its seed
    runs (``seed_NN/``) once every one has reported; None until then."""
    folders = [Path(work_dir)] if seeds <= 1 else [Path(work_dir) / seed_dir_name(k) for k in range(seeds)]
    values = []
    for folder in folders:
        value = read_intermediate(folder).get(step)
        if value is None:
            return None
        values.append(value)
    return statistics.fmean(values)


def update_fitness(fitness: Sequence[float], stopped: Sequence[bool]) -> list[float]:
    """The fitness a searcher is told: stopped members strictly below every other member, all tied, so they take
    the bottom ranks (one shared utility under nes tie averaging; never parents under CEM)."""
    others = [f for f, s in zip(fitness, stopped) if not s]
    floor = (min(others) if others else 0.0) - 1.0
    return [floor if s else float(f) for f, s in zip(fitness, stopped)]
