"""The save window after a job's end notice (core/notice_window.py): on the time-limit warning it follows
launcher.signal_delay_s (the launcher passes it to the job), not a fixed 25 s, so a member whose step takes longer
than 25 s still saves; the packed task waits by the same number; the dry-run plan warns when the delay cannot cover
a step and a save."""
from __future__ import annotations

import os
import signal
from typing import Any, Callable

import pytest

from inner_loop.process import notice
from launch.slurm.options import SlurmOptions
from launch.slurm.plan import notice_lines
from core.gpu_time import GpuSharing
from core.notice_window import SIGNAL_DELAY_ENV, save_window_s, signal_delay_s, task_grace_s


class SimulatedClock:
    """Stands in for threading.Timer: a deadline fires when simulated time passes it, not after real seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def timer(self, interval: float, function: Callable[[], None]) -> Any:
        clock = self

        class _Timer:
            daemon = False

            def start(self) -> None:
                clock.timers.append((clock.now + interval, function))

        return _Timer()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, function in due:
            function()


def test_the_window_follows_the_signal_delay_and_a_sigterm_keeps_killwait():
    assert save_window_s(signal.SIGUSR2, 120) == 110.0
    assert save_window_s(signal.SIGUSR2, 10) == save_window_s(signal.SIGTERM) == 25.0  # never below KillWait's
    assert task_grace_s(signal.SIGUSR2, 120) > save_window_s(signal.SIGUSR2, 120)  # the task outwaits its members
    assert signal_delay_s({SIGNAL_DELAY_ENV: "90"}) == 90.0 and signal_delay_s({}) is None
    params = SlurmOptions.from_options({"signal_delay_s": 120, "time_min": 60, "setup": ["module load cuda"]}) \
        .sbatch_parameters(3000.0)
    assert params["setup"] == [f"export {SIGNAL_DELAY_ENV}=120", "module load cuda"]  # what the member reads


def test_a_step_longer_than_25_s_still_saves_on_the_time_limit_warning(monkeypatch):
    """USR2 comes launcher.signal_delay_s (120 s) before the limit: a 40 s step (an A100 with two members on the card)
    ends and the checkpoint is asked for. With the old fixed 25 s the deadline fired mid-step and handed the signal
    on (submitit requeued) without a save."""
    clock = SimulatedClock()
    monkeypatch.setattr(notice.threading, "Timer", clock.timer)
    monkeypatch.setattr(notice, "_state", notice._State())
    monkeypatch.setenv(SIGNAL_DELAY_ENV, "120")
    handed_on: list[int] = []
    saved = {signum: signal.getsignal(signum) for signum in notice.NOTICE_SIGNALS}
    try:
        for signum in notice.NOTICE_SIGNALS:  # submitit's handler, which runs once the save is done
            signal.signal(signum, lambda s, _frame: handed_on.append(s))
        notice.install()
        notice.training(True)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert notice.requested() == signal.SIGUSR2
        clock.advance(40.0)  # the step under way ends 40 s after the warning
        assert handed_on == [] and notice.requested() == signal.SIGUSR2  # still waiting: the save comes next
        with pytest.raises(SystemExit):  # a trainer that never ends its step is not waited for past the window:
            clock.advance(80.0)  # the signal is handed on (submitit's handler, then the exit it would cause)
        assert handed_on == [signal.SIGUSR2]
    finally:
        notice.training(False)
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_a_step_longer_than_a_sigterm_leaves_is_logged_at_the_notice(monkeypatch, caplog):
    monkeypatch.setattr(notice.threading, "Timer", SimulatedClock().timer)
    monkeypatch.setattr(notice, "_state", notice._State())
    ticks = iter([0.0, 40.0])
    monkeypatch.setattr(notice.time, "monotonic", lambda: next(ticks))
    notice.training(True)
    notice.step_ended()  # one measured step of 40 s
    saved = signal.getsignal(signal.SIGTERM)
    try:
        notice.install()
        with caplog.at_level("WARNING", logger=notice.logger.name):
            os.kill(os.getpid(), signal.SIGTERM)
        assert "a step took 40 s here, longer than the 25 s" in caplog.text
    finally:
        notice._state.requested = None
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.parametrize("step_s, slowdown, least", [(15.0, 1.0, None), (15.0, 1.183, None), (110.0, 1.0, 135),
                                                     (100.0, 1.183, 144)])
def test_the_plan_warns_when_the_signal_delay_cannot_cover_a_step_and_a_save(step_s, slowdown, least):
    """The step the plan expects (resources.step_time_s x the sharing's slowdown), a save and the hand-on margins."""
    lines = notice_lines({"step_time_s": step_s}, GpuSharing(2, slowdown, "measured"), 120)
    assert bool(lines) == (least is not None)
    if least is not None:
        assert "launcher.signal_delay_s=120 s cannot cover a step" in lines[0] and f"at least {least}" in lines[0]
    assert notice_lines({}, GpuSharing(1, 1.0, None), 120) == []
