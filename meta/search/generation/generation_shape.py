"""One generation as a value: its members, its control member, its jobs, its quorum count and its early-stop capacity.

Why one value: the dry-run plan prices a generation and the orchestrator runs it, and the generation's close, early
stopping and the live view each decide who counts. Each used to count for itself (``index < population`` for "a
member, not the control", the quorum's rounding in the plan and again in the close, N read back from a tensor), so a
change on one side (a searcher without a control member) left the plan pricing jobs the run never submits. Built
once from the search config (meta/search/config.py ``generation_shape``), it is the one count both sides read.

Indices: the population's members are 0..population-1 (what the searcher asks and is told); the control member, when
the search has one, is the next index, ``population`` (the unperturbed centre with the generation's seed: recorded,
never told to the searcher, never counted toward the quorum or early stopping).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from meta.searchers.base import MemberWork, Searcher

#: role of a population member and of the control member (the member table's ``role`` column)
MEMBER_ROLE = "member"
CONTROL_ROLE = "control"


@dataclass(frozen=True)
class GenerationShape:
    """Who runs in one generation and how many of them each rule counts."""

    #: members the searcher samples and is told (indices 0..population-1)
    population: int
    #: whether the generation trains the control member (index ``population``) beside them
    control: bool = False
    #: fraction of the population whose final results let the generation close (1.0: wait for all)
    quorum: float = 1.0
    #: the most members early stopping may stop in one generation: those the searcher's update ignores
    early_stop_capacity: int = 0

    @classmethod
    def build(cls, population: int, es: Mapping[str, Any], control_member: bool = True,
              quorum: float = 1.0) -> "GenerationShape":
        """The shape of a search's generations from its settings: the searcher (``es.name``) says whether a control
        member can run (an online searcher's centre has no run of its own to continue) and how many members its
        update ignores (meta/searchers/base.py: online, stop_capacity)."""
        from meta.searchers import searcher_class

        searcher = searcher_class(str(es.get("name", "")))
        return cls(population=int(population), control=bool(control_member) and not searcher.online,
                   quorum=float(quorum), early_stop_capacity=int(searcher.stop_capacity(es, int(population))))

    def member_work(self, searcher: "Searcher", steps: int) -> list["MemberWork"]:
        """What each job of the next generation trains, in index order: the searcher's plan for its population, then
        the control member's run of its own of ``steps`` (es.member_steps), like a population member's."""
        from meta.searchers.base import MemberWork

        work = list(searcher.member_work(steps))
        if len(work) != self.population:
            raise ValueError(f"the searcher planned {len(work)} members' work for a population of {self.population}")
        return work + ([MemberWork(0, int(steps), int(steps))] if self.control else [])

    @property
    def control_index(self) -> int | None:
        """The control member's index (``population``), or None without one."""
        return self.population if self.control else None

    @property
    def jobs(self) -> int:
        """Jobs one generation submits: the population, plus the control member."""
        return self.population + (1 if self.control else 0)

    @property
    def members(self) -> range:
        """The population's indices (what the searcher is told)."""
        return range(self.population)

    def is_member(self, index: int) -> bool:
        """Whether ``index`` is a population member (counted by the quorum, early stopping, the failure threshold and
        the generation's statistics); the control member is not."""
        return 0 <= index < self.population

    def role(self, index: int) -> str:
        """``member`` or ``control``: the member table's role of ``index``; ValueError for an index outside the
        generation."""
        if self.is_member(index):
            return MEMBER_ROLE
        if index == self.control_index:
            return CONTROL_ROLE
        raise ValueError(f"member {index} is not in a generation of {self.jobs} job(s)")

    def share(self, fraction: float) -> int:
        """How many members ``fraction`` of the population is, rounded up (a float's last bit never adds one)."""
        return math.ceil(fraction * self.population - 1e-9)

    @property
    def quorum_count(self) -> int:
        """Final population members after which the generation may close (meta/search/generation/generation_close.py)."""
        return max(1, self.share(self.quorum))

    @property
    def closes_early(self) -> bool:
        """Whether the generation may close before every member is final (quorum below 1)."""
        return self.quorum < 1.0
