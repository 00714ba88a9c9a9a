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
from typing import Any, ClassVar, Mapping

import torch

from meta.searchers.utilities import TellSummary

DTYPE = torch.float64


class Searcher(abc.ABC):
    name: ClassVar[str] = ""
    #: antithetic (mirrored) sampling needs an even population
    needs_even_population: ClassVar[bool] = False
    #: the third-party modules it imports (beside torch and numpy), checked before a search starts: a GPU node that
    #: lacks one (ray cannot be carried to an air-gapped node) refuses the searcher with a message, not a traceback
    imports: ClassVar[tuple[str, ...]] = ()

    def __init__(self, center_init: torch.Tensor, popsize: int, seed: int) -> None:
        if center_init.ndim != 1:
            raise ValueError(f"centre init must be a vector, got shape {tuple(center_init.shape)}")
        self.dim = int(center_init.shape[0])
        self.popsize = int(popsize)
        self.seed = int(seed)
        check_population(self.name, self.popsize, self.needs_even_population)

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
