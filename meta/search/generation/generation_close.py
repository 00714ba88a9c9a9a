"""When a generation may close before its slowest members: the quorum and the straggler grace.

A generation of 180 multi-hour GPU runs otherwise waits for its slowest member (a slow node, a requeue), with the
other GPUs idle. Once ``quorum`` x population members are final, the generation waits ``straggler_grace`` x the
median running time of its finished members more, then closes: members still queued or running are cancelled
and recorded ``late`` (no measurement: the searcher leaves them out, and drops a pair with a late half).

The decision is written to ``closed.json`` in the generation directory BEFORE anything is cancelled, so a
restarted orchestrator settles exactly the same members as late (whatever result file a cancelled member still
managed to write) and the update it makes is the one the first process would have made.

Bias: members that finish late are not a random sample when running time correlates with fitness (in GRPO,
long completions take longer and may score differently). The guards: the quorum counts final members of the
population only (the control member never holds a generation open), the grace scales with the generation's
own median time so a uniformly slow generation is not cut, late members are dropped instead of imputed, and
pair-based searchers drop the whole antithetic pair, so the update stays a symmetric difference over the pairs
that completed. bench/bench_stragglers.py measures what remains on an objective whose time tracks fitness.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from meta.search.generation.generation_shape import GenerationShape
from core.records import ResultRecord


@dataclass
class QuorumClock:
    """Decides, poll after poll, whether (and which members) to close the generation as late.

    ``shape``: the generation (meta/search/generation/generation_shape.py): its quorum, and which members count toward it (the
    population's, never the control member). The clock starts when this process first sees the quorum reached: a
    restarted orchestrator waits its grace afresh (later, never earlier, than the first process would have closed)."""

    shape: GenerationShape
    grace: float
    reached_at: float | None = None
    _now: Callable[[], float] = field(default=time.monotonic, repr=False)

    @property
    def needed(self) -> int:
        return self.shape.quorum_count

    def enabled(self) -> bool:
        return self.shape.closes_early

    def deadline(self, final: Mapping[int, ResultRecord]) -> float | None:
        """Monotonic time at which the generation closes, or None while the quorum is not reached."""
        counted = [r for i, r in final.items() if self.shape.is_member(i)]
        if not self.enabled() or len(counted) < self.needed:
            return None
        if self.reached_at is None:
            self.reached_at = self._now()
        times = [r.wall_time_s for r in counted if r.ok and r.wall_time_s > 0] or [
            r.wall_time_s for r in counted if r.wall_time_s > 0
        ]
        median = statistics.median(times) if times else 0.0
        return self.reached_at + self.grace * median

    def late_members(self, final: Mapping[int, ResultRecord], pending: list[int]) -> list[int]:
        """The members to close as late now ([] to keep waiting). ``pending``: indices not final yet."""
        if not pending:
            return []
        deadline = self.deadline(final)
        if deadline is None or self._now() < deadline:
            return []
        return sorted(pending)
