"""What the orchestrator says while a generation runs: a progress line at a bounded rate, and warnings about
members that train on nothing (all-equal rewards in every group) or whose regularizer is inert.

The runner calls ``LiveWatch.tick`` once per polling round; it looks at the members' ledgers and progress files at
most every ``scan_interval_s`` (a shared filesystem must not be asked 180 x 2 files every second).
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from launch.member import read_ledger
from meta.search.generation.generation_shape import GenerationShape
from results.store.member_files import MemberProgress, read_progress
from core.records import STOPPED_EARLY

if TYPE_CHECKING:
    from launch.runner import MemberArrayRunner

logger = logging.getLogger("meta.progress")


@dataclass(frozen=True)
class GenerationSnapshot:
    generation: int
    total: int
    done: int
    running: int
    queued: int
    failed: int
    late: int
    best: float | None
    mean: float | None
    eta_s: float | None
    stopped_early: int = 0

    def counts(self) -> tuple[int, ...]:
        return self.done, self.running, self.queued, self.failed, self.late, self.stopped_early

    def line(self) -> str:
        best = f"{self.best:.4f}" if self.best is not None else "n/a"
        mean = f"{self.mean:.4f}" if self.mean is not None else "n/a"
        eta = format_duration(self.eta_s) if self.eta_s is not None else "unknown"
        early = f", stopped early {self.stopped_early}" if self.stopped_early else ""
        return (f"gen {self.generation}: done {self.done}/{self.total}, running {self.running}, queued {self.queued}, "
                f"failed {self.failed}, late {self.late}{early} | best {best}, mean {mean} | generation ETA {eta}")


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def member_state(runner: "MemberArrayRunner", index: int) -> str:
    """done / failed / late / ... for a final member; running when its ledger shows this attempt running, else queued."""
    if index in runner.final:
        return runner.final[index].status
    spec = runner.specs[index]
    ledger = read_ledger(spec.work_dir)
    return "running" if ledger is not None and ledger.attempt == spec.attempt and ledger.running else "queued"


def generation_eta(finished_times: Sequence[float], running: Sequence[MemberProgress | None], queued: int,
                   parallel_slots: int | None) -> float | None:
    """Seconds until the generation's last member is done: the slowest running member's remaining steps at its
    measured rate, and queued members at the median finished member's time per wave of free slots."""
    median = statistics.median(finished_times) if finished_times else None
    remaining = [p.remaining_s() for p in running if p is not None and p.remaining_s() is not None]
    if running and len(remaining) < len(running) and median is None:
        return None  # running members without a measured rate and nothing finished to compare with
    running_left = max(remaining, default=0.0)
    if running and len(remaining) < len(running):
        running_left = max(running_left, median or 0.0)
    if not queued:
        return running_left
    if median is None:
        return None
    slots = parallel_slots or queued
    return running_left + math.ceil(queued / max(1, slots)) * median


@dataclass
class ProgressLine:
    """Logs the snapshot when the counts changed and ``min_interval_s`` passed, and at least every
    ``max_interval_s`` even when nothing changed (hours of queueing are not silence)."""

    min_interval_s: float = 60.0
    max_interval_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    _last_at: float | None = None
    _last_counts: tuple[int, ...] | None = None

    def maybe_log(self, snapshot: GenerationSnapshot) -> bool:
        now = self.clock()
        since = math.inf if self._last_at is None else now - self._last_at
        changed = snapshot.counts() != self._last_counts
        if (changed and since >= self.min_interval_s) or since >= self.max_interval_s:
            logger.info("%s", snapshot.line())
            self._last_at, self._last_counts = now, snapshot.counts()
            return True
        return False


@dataclass
class MemberWatch:
    """Warns once per member and kind: zero-variance groups near 1 for a streak of logged steps (the member
    learns nothing: every group's rewards are equal), and a regularizer gradient share below the floor."""

    #: the run's divergence.grad_share_floor (its default: inner_loop/loss/divergences.py); None: no check
    grad_share_floor: float | None = None
    zero_std_threshold: float = 0.95
    streak: int = 5
    warned: set[tuple[str, str]] = field(default_factory=set)

    def check(self, label: str, progress: MemberProgress) -> list[str]:
        messages = []
        recent = progress.zero_std_recent[-self.streak:]
        if len(recent) >= self.streak and min(recent) >= self.zero_std_threshold:
            messages.append(self._once(label, "zero_std", (
                f"{label}: {min(recent):.0%} or more of its groups had all-equal rewards in each of its last "
                f"{len(recent)} logged steps (step {progress.step}/{progress.max_steps}): no advantage, no learning "
                "signal; check the task's rewards, the prompts and train.group_size")))
        shares = progress.grad_share_recent[-self.streak:]
        if self.grad_share_floor and len(shares) >= self.streak and statistics.fmean(shares) < self.grad_share_floor:
            messages.append(self._once(label, "grad_share", (
                f"{label}: the regularizer's gradient is {statistics.fmean(shares):.3g} of the policy term's over its "
                f"last {len(shares)} logged steps, below divergence.grad_share_floor={self.grad_share_floor:g}: the "
                "mirror map barely shapes its updates (raise divergence.coef)")))
        return [m for m in messages if m]

    def _once(self, label: str, kind: str, message: str) -> str:
        if (label, kind) in self.warned:
            return ""
        self.warned.add((label, kind))
        return message


def all_same_warning(generation: int, ok_fitness: Sequence[float]) -> str | None:
    """A generation whose finished members all scored the same tells the searcher nothing."""
    if len(ok_fitness) >= 2 and len(set(ok_fitness)) == 1:
        return (f"generation {generation}: all {len(ok_fitness)} finished members scored {ok_fitness[0]:.4f}: the "
                "generation carries no ranking information (searchers leave their state as it was); a larger "
                "validation set (train.val_size), a larger divergence.coef or a larger search spread separates them")
    return None


@dataclass
class LiveWatch:
    """The orchestrator's eyes on a running generation (scan rate-limited, see the module docstring)."""

    #: the generation (meta/search/generation/generation_shape.py): its best and mean are the population's, not the control's
    shape: GenerationShape
    #: the run's divergence.grad_share_floor, which the composed config always carries; None: no check
    grad_share_floor: float | None = None
    parallel_slots: int | None = None
    scan_interval_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    line: ProgressLine = field(default_factory=ProgressLine)
    watch: MemberWatch = field(default_factory=MemberWatch)
    _scanned_at: float = -math.inf

    def __post_init__(self) -> None:
        self.watch.grad_share_floor = self.grad_share_floor
        self.line.clock = self.clock

    def tick(self, generation: int, runner: "MemberArrayRunner") -> GenerationSnapshot | None:
        now = self.clock()
        if now - self._scanned_at < self.scan_interval_s:
            return None
        self._scanned_at = now
        snapshot = self.snapshot(generation, runner)
        self.line.maybe_log(snapshot)
        return snapshot

    def snapshot(self, generation: int, runner: "MemberArrayRunner") -> GenerationSnapshot:
        states = {index: member_state(runner, index) for index in runner.specs}
        running = [i for i, s in states.items() if s == "running"]
        progress = {i: read_progress(runner.specs[i].work_dir) for i in running}
        for index, member_progress in progress.items():
            if member_progress is not None:
                for message in self.watch.check(f"gen {generation} member {index:03d}", member_progress):
                    logger.warning("%s", message)
        ok = [r for i, r in runner.final.items() if r.ok and self.shape.is_member(i)]
        fitness = [r.fitness for r in ok]
        queued = sum(1 for s in states.values() if s == "queued")
        eta = generation_eta([r.wall_time_s for r in ok if r.wall_time_s > 0], list(progress.values()), queued,
                             self.parallel_slots)
        return GenerationSnapshot(
            generation=generation, total=len(states), done=sum(1 for s in states.values() if s == "ok"),
            running=len(running), queued=queued, late=sum(1 for s in states.values() if s == "late"),
            failed=sum(1 for s in states.values() if s not in ("ok", "late", "running", "queued", STOPPED_EARLY)),
            stopped_early=sum(1 for s in states.values() if s == STOPPED_EARLY),
            best=max(fitness) if fitness else None, mean=statistics.fmean(fitness) if fitness else None, eta_s=eta)
