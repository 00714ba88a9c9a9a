"""The named ranges of a member's step and of the owned decode loop (inner_loop/grpo/step_profile.py,
inner_loop/generation/owned_loop.py): free when no profile is taken, read from a profile per range, and the decode window's time split into the captured step,
eager work and the device's idle time.

Why: the GPU pass decides what to cut in a step from these figures (issue 60 item 5), so a range that costs time
unprofiled, a range lost on the rewards' thread, or a window whose device time is misfiled would decide wrongly. The
device-side split is checked on spans shaped as kineto reports them for a card (none is lent to the suite); the host
side on a real profile on this CPU.
"""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from inner_loop.generation.owned_loop import DECODE_REPLAY, DECODE_WINDOW
from inner_loop.grpo import step_profile as pr
from inner_loop.grpo.step_profile import DEVICE_RANGE, DEVICE_WORK, HOST_RANGE, SYNC, Span


def _profile() -> Any:
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config)


def test_a_range_makes_no_profiler_call_unprofiled_and_is_named_in_a_profile_on_any_thread(monkeypatch):
    calls = []
    enter = torch.ops.profiler._record_function_enter_new
    monkeypatch.setattr(torch.ops.profiler, "_record_function_enter_new",
                        lambda *args: calls.append(args) or enter(*args))
    with pr.step_range(pr.REWARD), pr.step_range(pr.BACKWARD):
        torch.ones(3).sum()
    assert calls == [] and pr.step_range(pr.REWARD) is pr.step_range(pr.BACKWARD)  # one shared null context

    def score() -> None:
        with pr.step_range(pr.REWARD):
            torch.ones(3).sum()

    with _profile() as prof:
        thread = threading.Thread(target=score)
        thread.start()
        with pr.step_range(pr.REFERENCE_FORWARD):
            torch.ones(3).sum()
        thread.join()
    assert len(calls) == 2
    spans = pr.spans_from_profile(prof)
    host = {s.name: s.thread for s in spans if s.kind == HOST_RANGE}
    assert set(host) == {pr.REWARD, pr.REFERENCE_FORWARD} and host[pr.REWARD] != host[pr.REFERENCE_FORWARD]


def _span(name: str, kind: str, start: int, end: int, thread: int = 1) -> Span:
    return Span(name, kind, start, end, thread)


def test_each_ranges_own_host_time_device_span_busy_time_and_syncs():
    ms = 1_000_000
    spans = [
        _span(pr.PREPARE_INPUTS, HOST_RANGE, 0, 100 * ms),
        _span(pr.GENERATE, HOST_RANGE, 5 * ms, 60 * ms),
        _span(pr.REFERENCE_FORWARD, HOST_RANGE, 60 * ms, 70 * ms),
        _span(pr.REWARD_WAIT, HOST_RANGE, 70 * ms, 90 * ms),
        _span(pr.REWARD, HOST_RANGE, 61 * ms, 89 * ms, thread=2),  # on its own thread: not inside prepare_inputs
        _span(pr.REFERENCE_FORWARD, DEVICE_RANGE, 62 * ms, 80 * ms),
        _span("k1", DEVICE_WORK, 62 * ms, 66 * ms), _span("k2", DEVICE_WORK, 65 * ms, 70 * ms),  # overlapping: 8 ms
        _span("k3", DEVICE_WORK, 78 * ms, 85 * ms),  # 2 ms of it inside the reference's span
        _span("sync", SYNC, 75 * ms, 76 * ms), _span("sync", SYNC, 95 * ms, 96 * ms),
    ]
    ranges = pr.step_figures(spans, count_syncs=True)
    prepare = ranges["prepare_inputs"]
    assert prepare["host_s"] == pytest.approx(0.1) and prepare["own_host_s"] == pytest.approx(0.015)  # TRL's own
    assert prepare["syncs"] == 2 and ranges["rewards_wait"]["syncs"] == 1 and ranges["generate"]["syncs"] == 0
    assert ranges["rewards"]["own_host_s"] == pytest.approx(0.028)
    reference = ranges["reference_forward"]
    assert reference["device_s"] == pytest.approx(0.018) and reference["busy_s"] == pytest.approx(0.010)
    assert ranges["generate"]["device_s"] == 0.0 and ranges["backward"]["calls"] == 0
    on_cpu = pr.step_figures([s for s in spans if s.kind == HOST_RANGE], count_syncs=False)
    assert on_cpu["reference_forward"]["device_s"] is None and on_cpu["prepare_inputs"]["syncs"] is None


def test_the_decode_windows_device_time_splits_into_the_captured_step_eager_work_and_idle():
    """Two replays in the window: kernels inside a replay's device span are the graph's, the finished flag's copy
    between them is eager, and the gaps (the device waiting for the host's next launch) are idle."""
    us = 1000
    spans = [
        _span(DECODE_WINDOW, HOST_RANGE, 0, 1000 * us),
        _span(DECODE_REPLAY, HOST_RANGE, 100 * us, 110 * us), _span(DECODE_REPLAY, HOST_RANGE, 500 * us, 510 * us),
        _span(DECODE_REPLAY, HOST_RANGE, 2000 * us, 2010 * us),  # after the window: not counted
        _span(DECODE_WINDOW, DEVICE_RANGE, 100 * us, 900 * us),
        _span(DECODE_REPLAY, DEVICE_RANGE, 100 * us, 300 * us), _span(DECODE_REPLAY, DEVICE_RANGE, 400 * us, 600 * us),
        _span("gemm", DEVICE_WORK, 100 * us, 250 * us), _span("softmax", DEVICE_WORK, 260 * us, 300 * us),
        _span("gemm", DEVICE_WORK, 400 * us, 600 * us), _span("flag copy", DEVICE_WORK, 650 * us, 700 * us),
    ]
    window = pr.decode_window_figures(spans)
    assert window["tokens"] == 2 and window["device"] == "cuda"
    assert window["device_ms"] == pytest.approx(0.4) and window["in_graph_ms"] == pytest.approx(0.195)
    assert window["eager_ms"] == pytest.approx(0.025) and window["idle_ms"] == pytest.approx(0.18)
    assert window["host_in_step_ms"] == pytest.approx(0.01)
    # kernels the profile did not attribute to any replay: no split is claimed
    unattributed = pr.decode_window_figures([s for s in spans if not (s.kind == DEVICE_RANGE
                                                                      and s.name == DECODE_REPLAY)])
    assert unattributed["in_graph_ms"] is None and "note" in unattributed and unattributed["idle_ms"] is not None
    assert pr.decode_window_figures([s for s in spans if s.name != DECODE_WINDOW]) is None


def test_the_owned_loop_names_sixteen_token_steps_under_a_profile_and_nothing_without():
    from inner_loop.generation.owned_loop import CHECK_EVERY, PROFILED_FROM_STEP, OwnedDecoder
    from test_decode_step import _left_padded, _tiny_model
    from transformers import GenerationConfig

    model, _ = _tiny_model()
    steps = PROFILED_FROM_STEP + CHECK_EVERY + 1
    config = GenerationConfig(max_new_tokens=steps, do_sample=True, temperature=0.7, top_p=0.9, pad_token_id=0,
                              eos_token_id=None)
    decoder = OwnedDecoder(model, [8], 2, steps, config, compile_backend="aot_eager")
    ids, mask = _left_padded([5, 7], seed=0)
    decoder.generate(model, ids, mask)  # compiles; no profile: no range opened
    with _profile() as prof:
        decoder.generate(model, ids, mask)
    window = pr.decode_window_figures(pr.spans_from_profile(prof))
    assert window["tokens"] == CHECK_EVERY and window["device"] == "cpu"
    assert 0 < window["in_graph_ms"] < window["host_ms"] and window["idle_ms"] is None
    assert window["eager_ms"] == pytest.approx(window["host_ms"] - window["in_graph_ms"])


class _Event:
    """A kineto event as torch without ``activity_type`` (the GPU node's 2.11) hands it over."""

    def __init__(self, name: str, on_device: bool, start: int, end: int, annotation: bool = False) -> None:
        from torch._C._autograd import DeviceType

        self._name, self._device = name, DeviceType.CUDA if on_device else DeviceType.CPU
        self._start, self._end, self._annotation = start, end, annotation

    def name(self) -> str:
        return self._name

    def device_type(self) -> Any:
        return self._device

    def start_ns(self) -> int:
        return self._start

    def duration_ns(self) -> int:
        return self._end - self._start

    def start_thread_id(self) -> int:
        return 7

    def is_user_annotation(self) -> bool:
        return self._annotation


def test_without_activity_types_ranges_and_device_work_are_told_apart_by_name(monkeypatch):
    events = [_Event(pr.BACKWARD, False, 0, 100, annotation=True), _Event(pr.BACKWARD, True, 10, 90),
              _Event("Optimizer.step#AdamW.step", False, 100, 120, annotation=True),
              _Event("Optimizer.step#AdamW.step", True, 101, 119),
              _Event("torch_compile_region", False, 0, 50, annotation=True),
              _Event("torch_compile_region", True, 5, 60),
              _Event("aten::mm", False, 10, 20), _Event("sm90_gemm", True, 10, 30)]
    results = type("Results", (), {"events": lambda self: events})()
    prof = type("Profile", (), {"profiler": type("Profiler", (), {"kineto_results": results})()})()
    monkeypatch.setattr(pr, "activity_types_known", lambda: False)
    spans = {(s.name, s.kind) for s in pr.spans_from_profile(prof)}
    assert spans == {(pr.BACKWARD, HOST_RANGE), (pr.BACKWARD, DEVICE_RANGE), (pr.OPTIMIZER_PREFIX, HOST_RANGE),
                     (pr.OPTIMIZER_PREFIX, DEVICE_RANGE), ("sm90_gemm", DEVICE_WORK)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_card_the_window_splits_the_devices_time_into_the_captured_step_eager_work_and_idle():
    """What the GPU pass reads from its profiled step: kineto attributes the kernels of each replay of the captured
    graph to its range on the device, so the window's device time splits into the three parts without a note."""
    from inner_loop.generation.owned_loop import CHECK_EVERY, PROFILED_FROM_STEP, OwnedDecoder
    from test_decode_loop import _config
    from test_decode_step_cuda import _lora_qwen3, _prompts

    model = _lora_qwen3("cuda").eval()
    steps = PROFILED_FROM_STEP + CHECK_EVERY + 1
    decoder = OwnedDecoder(model, [16], 4, steps, _config(steps, do_sample=True, temperature=0.7, top_p=0.9),
                           compile_backend="inductor")
    ids, mask = _prompts([5, 9, 14, 16], 0, "cuda")
    decoder.generate(model, ids, mask)  # compiles and captures
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        decoder.generate(model, ids, mask)
    window = pr.decode_window_figures(pr.spans_from_profile(prof))
    assert window["tokens"] == CHECK_EVERY and window["device"] == "cuda" and "note" not in window, window
    assert window["in_graph_ms"] > 0 and window["eager_ms"] >= 0 and window["idle_ms"] >= 0
    assert window["in_graph_ms"] + window["eager_ms"] + window["idle_ms"] == pytest.approx(window["device_ms"])
