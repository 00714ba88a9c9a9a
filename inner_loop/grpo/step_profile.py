"""A ``torch.profiler`` profile of one optimizer step of a member, read by the named ranges of
inner_loop/generation/profile_ranges.py.

Why: the GPU pass (scripts/gpu_pass.py, through bench/bench_member_gpu.py) must say where the part of a step that is
not generation goes (issue 60: ~1.6 s of an H200 step behaved like host time), per range in host and device seconds,
and whether the host waited for the card inside it. One step is profiled, after the compiling first one, and kept
out of the step time the bench reports: a profile slows what it records.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch
from transformers import TrainerCallback

from inner_loop.generation.profile_ranges import (STEP, activity_types_known, profile_summary, spans_from_profile,
                                                  step_range)

logger = logging.getLogger(__name__)


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
