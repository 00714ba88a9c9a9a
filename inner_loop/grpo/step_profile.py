"""A member's training step and the owned decode loop named for ``torch.profiler``, and what one profile of a step
says of each named range.

Why: of an ``mbpp_qwen3`` step on an H200 (6.29 s), 2.63 s are not generation, and about 1.6 s of them behave like
host time (issue 60): they grew when only the decode path changed and barely moved when a second member shared the
card. A timer per stage cannot tell host time from device time; a profile can, if the stages are named in it. The
trainer (inner_loop/grpo/trainer.py) opens these ranges, the owned decode loop its own (DECODE_WINDOW and
DECODE_REPLAY, generation/owned_loop.py), and a profile of one step (StepProfileCallback; the GPU pass takes one
through bench/bench_member_gpu.py) gives per range its host seconds (inclusive, and its own: less the named ranges
inside it), its device seconds (the span of its kernels on the card), its busy seconds (the kernels' own time within
that span) and the host waits for the card (CUDA synchronisation events) that started inside it. The profiled step
is kept out of the step time the bench reports: a profile slows what it records.

The ranges cost nothing when no profile is taken: :func:`step_range` returns one shared null context unless torch's
profiler is on (a module attribute torch sets when a profile starts), so an unprofiled step makes no profiler call
for them.
"""
from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
from torch._C._autograd import DeviceType
from transformers import TrainerCallback

from inner_loop.generation.owned_loop import DECODE_REPLAY, DECODE_WINDOW, profiling

logger = logging.getLogger(__name__)

PREFIX = "mirror_es."
#: one optimizer step, from the callback that profiles it (StepProfileCallback)
STEP = PREFIX + "step"
#: the trainer's micro-step: TRL's generation and scoring, the loss, the backward
TRAINING_STEP = PREFIX + "training_step"
#: TRL's ``_prepare_inputs`` (generation, rewards, advantages, its metrics and logs, shuffle and split): its own time,
#: less the named ranges inside it, is TRL's bookkeeping
PREPARE_INPUTS = PREFIX + "prepare_inputs"
GENERATE = PREFIX + "generate"
#: the rewards (the sandbox's grading), on the thread that scores them
REWARD = PREFIX + "rewards"
#: the trainer's thread waiting for the rewards after the reference forward (what the overlap did not hide)
REWARD_WAIT = PREFIX + "rewards_wait"
REFERENCE_FORWARD = PREFIX + "reference_forward"
#: the trainer's ``_compute_loss``: its own time is the loss's arithmetic and metrics
COMPUTE_LOSS = PREFIX + "compute_loss"
POLICY_FORWARD = PREFIX + "policy_forward"
BACKWARD = PREFIX + "backward"
GRAD_CLIP = PREFIX + "grad_clip"
#: torch's own range around every optimizer's step ("Optimizer.step#AdamW.step")
OPTIMIZER_PREFIX = "Optimizer.step#"
#: the short names a summary reports the step's ranges under, in the order of a step
STEP_RANGES = {"step": STEP, "training_step": TRAINING_STEP, "prepare_inputs": PREPARE_INPUTS, "generate": GENERATE,
               "rewards": REWARD, "rewards_wait": REWARD_WAIT, "reference_forward": REFERENCE_FORWARD,
               "compute_loss": COMPUTE_LOSS, "policy_forward": POLICY_FORWARD, "backward": BACKWARD,
               "grad_clip": GRAD_CLIP, "optimizer": OPTIMIZER_PREFIX}
_NAMES = frozenset({*STEP_RANGES.values(), DECODE_WINDOW, DECODE_REPLAY})

#: span kinds read from a profile
HOST_RANGE, DEVICE_RANGE, DEVICE_WORK, SYNC = "host_range", "device_range", "device_work", "sync"
#: kineto's activity types: the host's ranges, their spans on the device, the device's own work, its syncs
_KINDS = {"user_annotation": HOST_RANGE, "gpu_user_annotation": DEVICE_RANGE, "kernel": DEVICE_WORK,
          "gpu_memcpy": DEVICE_WORK, "gpu_memset": DEVICE_WORK, "cuda_sync": SYNC}

_OFF = contextlib.nullcontext()


def step_range(name: str) -> ContextManager[Any]:
    """A named range in a profile; the shared null context when no profile is being taken."""
    return torch.profiler.record_function(name) if profiling() else _OFF


def _range_name(name: str) -> str | None:
    """The range ``name`` is counted under (the optimizer's step by its prefix), None for any other event."""
    if name in _NAMES:
        return name
    return OPTIMIZER_PREFIX if name.startswith(OPTIMIZER_PREFIX) else None


@dataclass(frozen=True)
class Span:
    """One event of a profile, as far as the summaries need it."""

    name: str
    kind: str
    start_ns: int
    end_ns: int
    thread: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def activity_types_known() -> bool:
    """Whether this torch tells a profile's events by kineto's activity type (torch 2.13 does; the GPU node's 2.11
    may not): without it the ranges and the device's work are told apart by name, and CUDA synchronisation events,
    which would pass for work, are not recorded."""
    return hasattr(torch._C._autograd._KinetoEvent, "activity_type")


def spans_from_profile(prof: Any) -> list[Span]:
    """The named ranges (host and device side), the device's work and its syncs of a finished ``torch.profiler``
    profile, read from kineto's raw events (not torch's event tree, whose building takes seconds for a step's
    ~10^5 kernels)."""
    events = prof.profiler.kineto_results.events()
    kind_of = _kind_by_activity if activity_types_known() else _kind_by_name(events)
    out = []
    for event in events:
        kind = kind_of(event)
        if kind is None:
            continue
        name = event.name()
        if kind in (HOST_RANGE, DEVICE_RANGE):
            name = _range_name(name)
            if name is None:
                continue
        start = int(event.start_ns())
        out.append(Span(name, kind, start, start + int(event.duration_ns()), int(event.start_thread_id())))
    return out


def _kind_by_activity(event: Any) -> str | None:
    return _KINDS.get(event.activity_type())


def _kind_by_name(events: Any) -> Any:
    """Without activity types: a range is named as ours on the host or the device; any other device event is work,
    unless it carries the name of a range opened on the host (another range's span on the device)."""
    annotations = {e.name() for e in events
                   if e.device_type() == DeviceType.CPU and getattr(e, "is_user_annotation", lambda: False)()}

    def kind(event: Any) -> str | None:
        name, on_device = event.name(), event.device_type() != DeviceType.CPU
        if _range_name(name) is not None:
            return DEVICE_RANGE if on_device else HOST_RANGE
        if on_device and name not in annotations:
            return DEVICE_WORK
        return None

    return kind


class _Busy:
    """The device's work as disjoint intervals: how much of any interval the device was busy."""

    def __init__(self, work: Iterable[Span]) -> None:
        merged: list[list[int]] = []
        for span in sorted(work, key=lambda s: s.start_ns):
            if merged and span.start_ns <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], span.end_ns)
            else:
                merged.append([span.start_ns, span.end_ns])
        self.starts = [m[0] for m in merged]
        self.intervals = merged

    def within(self, start: int, end: int) -> int:
        """Nanoseconds of [start, end) during which the device ran something."""
        total = 0
        index = max(0, bisect.bisect_right(self.starts, start) - 1)
        while index < len(self.intervals) and self.intervals[index][0] < end:
            a, b = self.intervals[index]
            total += max(0, min(b, end) - max(a, start))
            index += 1
        return total


def _own_seconds(ranges: list[Span]) -> dict[int, float]:
    """Each host range's own seconds (by its index in ``ranges``): its length less the ranges directly inside it on
    its thread."""
    own = {i: r.seconds for i, r in enumerate(ranges)}
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(ranges):
        by_thread[r.thread].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (ranges[i].start_ns, -ranges[i].end_ns))
        stack: list[int] = []
        for i in indices:
            while stack and ranges[stack[-1]].end_ns <= ranges[i].start_ns:
                stack.pop()
            if stack:
                own[stack[-1]] -= ranges[i].seconds
            stack.append(i)
    return own


def step_figures(spans: list[Span], count_syncs: bool) -> dict[str, Any]:
    """Per named range of a profiled step: ``calls``, ``host_s`` (inclusive), ``own_host_s`` (less the named ranges
    inside it: for ``prepare_inputs`` that is TRL's bookkeeping, for ``compute_loss`` the loss's arithmetic and
    metrics), ``device_s`` (the span of its kernels on the device), ``busy_s`` (the device's work within that span)
    and ``syncs`` (CUDA synchronisation events that began inside it: the host waiting for the card; None where the
    profile did not record them). Device figures are None where the profile saw no device (the CPU)."""
    host = [s for s in spans if s.kind == HOST_RANGE and s.name not in (DECODE_WINDOW, DECODE_REPLAY)]
    device = [s for s in spans if s.kind == DEVICE_RANGE]
    syncs = sorted(s.start_ns for s in spans if s.kind == SYNC)
    busy = _Busy(s for s in spans if s.kind == DEVICE_WORK)
    seen_device = bool(busy.intervals)
    own = _own_seconds(host)
    out: dict[str, Any] = {}
    for short, name in STEP_RANGES.items():
        mine = [i for i, s in enumerate(host) if s.name == name]
        on_device = [s for s in device if s.name == name]
        figures: dict[str, Any] = {
            "calls": len(mine), "host_s": sum(host[i].seconds for i in mine), "own_host_s": sum(own[i] for i in mine),
            "device_s": sum(s.seconds for s in on_device) if seen_device else None,
            "busy_s": sum(busy.within(s.start_ns, s.end_ns) for s in on_device) / 1e9 if seen_device else None,
            "syncs": sum(bisect.bisect_left(syncs, host[i].end_ns) - bisect.bisect_left(syncs, host[i].start_ns)
                         for i in mine) if count_syncs else None}
        out[short] = figures
    return out


def decode_window_figures(spans: list[Span]) -> dict[str, Any] | None:
    """The owned loop's profiled token steps (DECODE_WINDOW, one check period): per token step, the device's time in
    the captured step (``in_graph_ms``), its work outside it (``eager_ms``: the finished flag's read, anything
    launched eagerly) and its idle time (``idle_ms``: waiting for the host), over the span of the window's work on
    the device (``device_ms``), beside the host's time per token step in and around the replays. On a CPU the
    "graph" is the compiled step the host runs: ``in_graph_ms`` is the host's time in it, ``eager_ms`` the rest,
    ``idle_ms`` None. None: no window was profiled (another decode path, or completions shorter than the window)."""
    windows = [s for s in spans if s.kind == HOST_RANGE and s.name == DECODE_WINDOW]
    if not windows:
        return None
    window = windows[0]
    replays = [s for s in spans if s.kind == HOST_RANGE and s.name == DECODE_REPLAY
               and s.thread == window.thread and window.start_ns <= s.start_ns < window.end_ns]
    tokens = len(replays)
    if not tokens:
        return None
    host_ms = window.seconds * 1e3
    in_step_ms = sum(s.seconds for s in replays) * 1e3
    out: dict[str, Any] = {"tokens": tokens, "host_ms": host_ms / tokens, "host_in_step_ms": in_step_ms / tokens,
                           "host_outside_step_ms": (host_ms - in_step_ms) / tokens, "device": None,
                           "device_ms": None, "in_graph_ms": None, "eager_ms": None, "idle_ms": None}
    busy = _Busy(s for s in spans if s.kind == DEVICE_WORK)
    if not busy.intervals:  # the CPU: the host runs the compiled step itself
        out.update(device="cpu", in_graph_ms=in_step_ms / tokens, eager_ms=(host_ms - in_step_ms) / tokens)
        return out
    out["device"] = "cuda"
    on_device = [s for s in spans if s.kind == DEVICE_RANGE and s.name == DECODE_WINDOW]
    if not on_device:
        out["note"] = "the profile holds no device span of the window: its kernels were not attributed to it"
        return out
    span = on_device[0]
    graph = [s for s in spans if s.kind == DEVICE_RANGE and s.name == DECODE_REPLAY
             and span.start_ns <= s.start_ns < span.end_ns]
    work = busy.within(span.start_ns, span.end_ns)
    in_graph = sum(busy.within(s.start_ns, s.end_ns) for s in graph)
    out.update(device_ms=span.seconds * 1e3 / tokens, in_graph_ms=in_graph / 1e6 / tokens,
               eager_ms=(work - in_graph) / 1e6 / tokens, idle_ms=(span.end_ns - span.start_ns - work) / 1e6 / tokens)
    if not graph:
        out["note"] = "no device span of a replay inside the window: the captured step's kernels were not attributed"
        out["in_graph_ms"] = out["eager_ms"] = None
    return out


def profile_summary(spans: list[Span], count_syncs: bool) -> dict[str, Any]:
    """What a profiled step records: the per-range figures and the decode window's."""
    return {"ranges": step_figures(spans, count_syncs), "decode_window": decode_window_figures(spans),
            "sync_events": count_syncs}


def _start_profiler(cuda: bool) -> tuple[Any, bool]:
    """A started profiler of every thread (the rewards are scored on one of their own), with the device's activity
    on CUDA and its synchronisation events where this torch can tell them from the device's work
    (``activity_types_known``); and whether those events are recorded. An option this torch lacks is dropped, with
    a warning, rather than failing the member."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    config_type = torch._C._profiler._ExperimentalConfig
    syncs = cuda and activity_types_known()
    tries = [({"profile_all_threads": True, "enable_cuda_sync_events": True}, True)] if syncs else []
    tries += [({"profile_all_threads": True}, False), ({}, False)]
    for options, with_syncs in tries:
        try:
            prof = torch.profiler.profile(activities=activities, experimental_config=config_type(**options))
            prof.start()
        except (TypeError, RuntimeError) as exc:
            logger.warning("step profile: %s refused (%s); trying without", sorted(options) or "the profiler", exc)
            continue
        if "profile_all_threads" not in options:
            logger.warning("step profile: this torch profiles the trainer's thread only: the rewards' range is "
                           "missing from it")
        return prof, with_syncs
    raise RuntimeError("torch.profiler could not start a profile of the step")


class StepProfileCallback(TrainerCallback):
    """Profile optimizer step ``step`` (1-based: ``state.global_step`` once it ended), from ``on_step_begin`` (before
    its generation) to ``on_step_end`` (after the optimizer's step); :attr:`summary` holds what it found."""

    def __init__(self, step: int) -> None:
        if step < 1:
            raise ValueError(f"the profiled step must be >= 1, got {step}")
        self.step = step
        self.summary: dict[str, Any] | None = None
        self._prof: Any = None
        self._range: Any = None
        self._syncs = False
        self._began = 0.0
        self._device = "cpu"

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None or self.summary is not None or state.global_step + 1 != self.step:
            return
        self._device = torch.device(args.device).type
        self._prof, self._syncs = _start_profiler(self._device == "cuda")
        self._range = step_range(STEP)
        self._range.__enter__()
        self._began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None:
            self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None:  # the run ended inside the profiled step
            self._finish()

    def _finish(self) -> None:
        wall = time.perf_counter() - self._began
        self._range.__exit__(None, None, None)
        prof, self._prof, self._range = self._prof, None, None
        prof.stop()  # on CUDA it waits for the card first
        began = time.perf_counter()
        summary = profile_summary(spans_from_profile(prof), self._syncs)
        summary.update(step=self.step, device=self._device, wall_s=wall,
                       read_s=time.perf_counter() - began)
        self.summary = summary
        logger.info("step %d profiled (%s, %.2f s, read in %.1f s)", self.step, self._device, wall, summary["read_s"])
