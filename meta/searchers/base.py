"""One small ask/tell interface over every search algorithm, with explicit, serialisable state.

Contract: ``ask(generation)`` is a pure function of the state and (run seed, generation), so a population
asked again after a crash is identical; ``tell`` receives finite fitness only (failures already mapped to
``fitness_on_failure``) plus an ``ok`` mask for rules that treat failed members specially and a ``late`` mask of
members with no measurement at all (cancelled at the generation's quorum: their entries are placeholders), and
returns a TellSummary saying what it used. Ties and no-information generations: meta/searchers/utilities.py and
docs/searchers.md. Fitness is MAXIMISED. ``state_dict`` holds only tensors and plain Python values (loadable with weights_only=True).
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from core.records import Segment
from meta.searchers.utilities import TellSummary
from core.config.group_schemas import setting
DTYPE = torch.float64


@dataclass
class SearcherSettings:
    """The es node: what every searcher's settings share. A searcher declares its own keys as a subclass
    (``Searcher.settings_class``), registered in Hydra's ConfigStore as ``es/<name>_schema``, which its YAML
    (conf/es/<name>.yaml) names first in its defaults and then sets only what differs, so each field is the one home
    of its key's type, default and help. A field with ``added=True`` in its metadata is a key the searcher's YAML did
    not write before its schema did: a search stored earlier lacks it and ran with its default, which its config hash
    leaves out (meta/settings/keys.py)."""

    name: str = setting("", "the searcher (the es group's option: conf/es/<name>.yaml)")
    radius: float = setting(0.01, "the search radius, the per-coordinate spread of the samples around the centre (pgpe, "
                                  "snes and cem start their stdev there, cmaes its step size, openai_es_elite and nres "
                                  "their sigma); a preset sets it, meta.pilot scans it (pilot.radii)")
    member_steps: Any = setting(
        None, "training steps of one search member (null: train.steps, which stays the length of the exported single "
              "run, the selection and reporting runs and transfer; a member's schedule is train's shrunk to its own "
              "steps). Shorter members cost less but rank maps by how they do early (short-horizon bias): "
              "meta.pilot's horizon check measures whether member_steps ranks maps as train.steps does "
              "(docs/pilot.md); not a setting of the searcher itself. An integer from 1 to train.steps or null: "
              "meta/settings/schema.py checks it against train.steps, naming both")

    #: the keys that are the search's, not the searcher's: its constructor does not take them
    SEARCH_OWN: ClassVar[tuple[str, ...]] = ("name", "member_steps")

    def keywords(self) -> dict[str, Any]:
        """The settings the searcher's constructor takes, as keywords (every field but the search's own)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.SEARCH_OWN}


@dataclass(frozen=True)
class EarlyStopRule:
    """When stopping the bottom members of a generation early leaves a searcher's update exactly as the full runs
    would have made it (meta/early_stop.py asks; docs/extending.md says how to declare it)."""

    #: the settings that make it exact, as the refusal message names them ("ranking_method nes")
    when: str
    #: es settings under which it is exact: meta.early_cuts measures this searcher's update with them
    example: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberWork:
    """What one population member trains next, as its searcher plans it: steps [start, stop) of a run whose schedule
    spans ``horizon`` steps. The orchestrator turns it into the member's segment (core/records.py: Segment), so no
    other module works out a member's steps from the searcher's state."""

    start: int
    stop: int
    horizon: int
    #: the (particle, episode) whose run this member continues from the particle's checkpoints (es=nres); None: a run
    #: of its own
    run: tuple[int, int] | None = None
    #: what its training seeds are drawn by (core/seeding.py member_seed's keys), where the searcher decides it (the
    #: halves of an antithetic pair share their run's seed); None: the generation's own rule
    seed_key: tuple[Any, ...] | None = None

    def segment(self, resume_from: str | None = None) -> Segment:
        """These steps as a member's segment (core/records.py), resumed from ``resume_from`` where given."""
        return Segment(self.start, self.stop, self.horizon, resume_from)


class Searcher(abc.ABC):
    """Besides ask/tell, a searcher class declares what the rest of the code asks about it (docs/extending.md):
    the registry at the package door reads these, and no other module names a searcher. Its constructor takes the
    es settings as keywords, among them ``radius`` (es.radius, every searcher's one name for the spread of its
    samples: meta/searchers/radius.py), which it maps to its own algorithm's argument. The keywords are the fields of
    its settings class (``settings_class``), read from the es node by meta.searchers.build_searcher: that class is
    their one home, so the constructor writes no default of its own."""

    name: ClassVar[str] = ""
    #: antithetic (mirrored) sampling: the population must be even and a failed member drops its pair
    antithetic: ClassVar[bool] = False
    #: where early stopping is exact for it (None: nowhere; early_stop_reason says why)
    early_stop: ClassVar[EarlyStopRule | None] = None
    #: why early stopping would change its update, shown when early_stop.enabled=true is refused
    early_stop_reason: ClassVar[str] = "its update reads every member"
    #: the third-party modules it imports (beside torch and numpy), checked before a search starts: a GPU node that
    #: lacks one (ray cannot be carried to an air-gapped node) refuses the searcher with a message, not a traceback
    imports: ClassVar[tuple[str, ...]] = ()
    #: online (es=nres): a member trains one truncation of its particle's long run (``truncations``), not a whole run;
    #: such a search has no control member (the centre has no run of its own to continue)
    online: ClassVar[bool] = False
    #: the dataclass of its es settings (a SearcherSettings subclass); None: derived once from its constructor's
    #: keyword-only parameters (meta.searchers.settings_class_of), for a searcher declared before settings classes
    settings_class: ClassVar[type[SearcherSettings] | None] = None

    @classmethod
    def check_population(cls, popsize: int) -> None:
        """The population rule: ValueError naming the fix when ``popsize`` cannot be sampled (at least 2; even
        when antithetic). Override to add a rule of the searcher's own."""
        check_population(cls.name, popsize, cls.antithetic)

    @classmethod
    def search_refusal(cls, settings: Mapping[str, Any], train_steps: int, member_steps: int,
                       seeds_per_member: int) -> str | None:
        """Why this searcher cannot run a search of these settings (``settings``: the es node; a run of
        ``train_steps``, members of ``member_steps``, each on ``seeds_per_member`` seeds); None: it can. The rule
        across keys that only the searcher knows; override to add one."""
        return None

    @classmethod
    def early_stop_refusal(cls, settings: Mapping[str, Any]) -> str | None:
        """Why this searcher's update would change when bottom members stop early under ``settings`` (the es
        node); None: it would not. Override where exactness depends on the settings."""
        return None if cls.early_stop is not None else cls.early_stop_reason

    @classmethod
    def stop_capacity(cls, settings: Mapping[str, Any], population: int) -> int:
        """How many members the update ignores (the most early stopping may cut): the bottom floor(N/2) here."""
        return population // 2

    def __init__(self, center_init: torch.Tensor, popsize: int, seed: int) -> None:
        if center_init.ndim != 1:
            raise ValueError(f"centre init must be a vector, got shape {tuple(center_init.shape)}")
        self.dim = int(center_init.shape[0])
        self.popsize = int(popsize)
        self.seed = int(seed)
        self.check_population(self.popsize)

    @classmethod
    def planned_member_steps(cls, settings: Mapping[str, Any], population: int, generations: int) -> int | None:
        """An online searcher's member-steps over ``generations`` when nothing fails (the dry-run plan prices them);
        None: every member trains a whole run of train.steps."""
        return None

    @classmethod
    def longest_member_steps(cls, settings: Mapping[str, Any]) -> int | None:
        """An online searcher's most steps in one member (its longest truncation: what a member's time limit must
        cover); None: a member trains a whole run of es.member_steps."""
        return None

    @classmethod
    def steady_member_steps(cls, settings: Mapping[str, Any]) -> int | None:
        """An online searcher's most steps in one member after its first generation (one truncation; a staggered
        start's first truncations can be longer: ``longest_member_steps``); None: as ``longest_member_steps``."""
        return None

    def member_work(self, steps: int) -> list[MemberWork]:
        """Per population member, what the next generation trains: here a run of its own of ``steps`` steps (the
        search's es.member_steps); an online searcher's members continue its particles' runs."""
        return [MemberWork(0, int(steps), int(steps)) for _ in range(self.popsize)]

    def truncations(self) -> list[dict[str, int]] | None:
        """An online searcher's pieces for the next generation, one per member ({particle, episode, start, stop,
        horizon}: results/store/truncation.py); None: every member trains a whole run."""
        return None

    def kept_boundaries(self) -> list[tuple[int, int]] | None:
        """An online searcher's (episode, step) per member: the checkpoint its particle stands on now."""
        return None

    @abc.abstractmethod
    def ask(self, generation: int) -> torch.Tensor:
        """The population of ``generation`` as a (popsize, dim) float64 tensor."""

    @abc.abstractmethod
    def tell(self, generation: int, values: torch.Tensor, fitness: torch.Tensor, ok: torch.Tensor,
             late: torch.Tensor | None = None) -> "TellSummary":
        """Update from finite fitnesses (higher is better) of the asked ``values``; ``late`` members left out."""

    @property
    @abc.abstractmethod
    def center(self) -> torch.Tensor:
        """The current centre (mean) of the search distribution."""

    @property
    def averaged_center(self) -> torch.Tensor | None:
        """A centre averaged over recent updates (an online searcher's Polyak average over its last episode), which
        selection nominates beside the centre; None: the searcher keeps no average."""
        return None

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def _check_tell(self, values: torch.Tensor, fitness: torch.Tensor) -> None:
        if values.shape != (self.popsize, self.dim) or fitness.shape != (self.popsize,):
            raise ValueError(
                f"{self.name}.tell: expected values {(self.popsize, self.dim)} and fitness ({self.popsize},), "
                f"got {tuple(values.shape)} and {tuple(fitness.shape)}"
            )
        if not torch.isfinite(fitness).all():
            raise ValueError(f"{self.name}.tell: non-finite fitness would corrupt the search: {fitness.tolist()}")


def check_population(name: str, popsize: int, needs_even: bool) -> None:
    if popsize < 2:
        raise ValueError(f"population must be at least 2 (got {popsize})")
    if needs_even and popsize % 2:
        raise ValueError(
            f"population={popsize} is odd but es={name} samples antithetic pairs; set an even population "
            f"(e.g. population={popsize + 1})"
        )
