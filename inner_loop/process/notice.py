"""Save on notice: a member told that its job is about to end saves a checkpoint at the end of its current step.

Why: periodic checkpoints (``train.save_every``) alone lose up to ``save_every`` steps to every requeue, time
limit or preemption (~25 minutes of GPU time at 100 steps of 15 s). The notices a member gets are SLURM's SIGTERM
(``scontrol requeue``, a preemption, a cancel; SIGKILL follows ``KillWait`` seconds later) and the time-limit
warning submitit asks for with ``--signal`` (``USR2``, submitit's requeue signal). On either, the process that
trains asks the trainer (``SaveOnNoticeCallback``) to save at the end of the step under way; once the checkpoint is
on disk the run stops with ``NoticeHonoured`` (no record: the requeued run resumes from that checkpoint), and the
job process then does what it would have done on the signal (submitit requeues on ``USR2``; the process exits on
SIGTERM). A member not training yet (loading, validating) hands the signal on at once. A trainer that does not
reach the end of its step within its window is not waited for: the signal is handed on and the last periodic
checkpoint is what the requeued run finds. The window follows the notice (core/notice_window.py): on the
time-limit warning ``launcher.signal_delay_s`` less a few seconds, on a SIGTERM SLURM's KillWait less those; a
member whose measured step is longer than its window says so when the notice comes.

A pinned member trains in a child process (inner_loop/member/entry.py): the job process forwards the notice to
the child and waits for it to save; the child exits with ``SAVED_ON_NOTICE_EXIT``.

Light on purpose (no torch): imported by every job process.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Protocol

from core.notice_window import save_window_s

logger = logging.getLogger(__name__)


class ChildProcess(Protocol):
    """What a notice needs of the pinned child it is forwarded to: a subprocess.Popen, or a child forked by the fork
    server (inner_loop/process/fork_server.py's ForkedChild)."""

    def poll(self) -> int | None: ...

    def send_signal(self, signum: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

#: the signals that announce a job's end: SLURM's SIGTERM and the time-limit warning (submitit's USR2)
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
#: a pinned child has the same window as its job process; the job process waits this much longer, so that the child's
#: own deadline (handing the signal on, exiting) ends the wait, not the parent's timeout
_CHILD_MARGIN_S = 2.0
#: exit status of a pinned child that saved on notice and stopped (EX_TEMPFAIL: run it again)
SAVED_ON_NOTICE_EXIT = 75


class NoticeHonoured(BaseException):
    """Raised once the notice's checkpoint is on disk: the run stops here, without a record.

    A BaseException, like launch.member.MemberTimeout: ``train_in_process`` records its failures with ``except
    Exception``, and a run stopped for a requeue is no failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"saved a checkpoint on {signal.Signals(signum).name} and stopped")
        self.signum = signum


class _State:
    """This process's notice handling (one per process: signal handlers are per process)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.grace_s: float | None = None  # fixed by install(); None: the notice's own window (notice_window.py)
        self.step_started: float | None = None  # monotonic time the step under way started
        self.step_s: float | None = None  # the last whole step's duration, seconds
        self.training = False  # a trainer in this process is between its first and last step
        self.requested: int | None = None  # the notice's signal, once one came during training
        self.child: ChildProcess | None = None  # the pinned child training this member
        self.forwarding = False  # waiting for that child to save
        self.forced = False  # the grace period ended: hand the signal on


_state = _State()


def install(grace_s: float | None = None) -> None:
    """Handle the notice signals in this process, keeping what was installed before (submitit's handlers) as what
    runs once the checkpoint is saved. Main thread only (Python's rule for signal handlers). ``grace_s``: a fixed
    wait for every notice (None: each notice's window, from launcher.signal_delay_s or SLURM's KillWait)."""
    _state.grace_s = grace_s
    for signum in NOTICE_SIGNALS:
        current = signal.getsignal(signum)
        if current is not _on_notice:
            _state.previous[signum] = current
            signal.signal(signum, _on_notice)


def attach_child(child: ChildProcess | None) -> None:
    """The pinned child now training this member (None: it ended); a notice is forwarded to it."""
    _state.child = child


def training(active: bool) -> None:
    """Called by SaveOnNoticeCallback as training starts and ends."""
    _state.training = active
    _state.step_started = time.monotonic() if active else None
    if not active:
        _state.requested = None


def step_ended() -> None:
    """Called by SaveOnNoticeCallback at the end of every step: the step's measured time is what a notice compares
    its window with."""
    now = time.monotonic()
    if _state.step_started is not None:
        _state.step_s = now - _state.step_started
    _state.step_started = now


def window_s(signum: int) -> float:
    """Seconds this process waits after notice ``signum`` for its step to end and its checkpoint to be written."""
    return _state.grace_s if _state.grace_s is not None else save_window_s(signum)


def requested() -> int | None:
    """The signal of a notice that asks the trainer to save at the end of its step (None: none)."""
    return _state.requested


def hand_on(signum: int) -> None:
    """Do what this process would have done on ``signum`` without us: the earlier handler (submitit requeues the
    job and exits on its signal), else exit as the signal would."""
    previous = _state.previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, None)
    if previous is signal.SIG_IGN:
        return
    raise SystemExit(128 + signum)


def _on_notice(signum: int, frame: Any) -> None:
    # SLURM signals every process of the job: a pinned child may get the same notice twice (from SLURM and
    # forwarded), so a repeat is ignored; only the grace period's end hands the signal on without a save.
    name = signal.Signals(signum).name
    child = _state.child
    if _state.forwarding:
        return
    if child is not None and child.poll() is None:
        logger.warning("%s: asking the member's pinned process to save a checkpoint and stop", name)
        _forward_and_wait(child, signum)
        return
    if _state.training and not _state.forced:
        if _state.requested is None:
            window = window_s(signum)
            logger.warning("%s: saving a checkpoint at the end of the current step (waiting up to %.0f s), then "
                           "stopping", name, window)
            if _state.step_s is not None and _state.step_s > window:
                logger.warning("a step took %.0f s here, longer than the %.0f s this notice leaves: the save may not "
                               "happen (raise launcher.signal_delay_s; docs/slurm.md)", _state.step_s, window)
            _state.requested = signum
            _start_deadline(signum)
        return
    _state.requested = None
    hand_on(signum)


def _forward_and_wait(child: ChildProcess, signum: int) -> None:
    _state.forwarding = True
    try:
        child.send_signal(signum)
        code = child.wait(timeout=window_s(signum) + _CHILD_MARGIN_S)
    except subprocess.TimeoutExpired:
        logger.warning("the member's pinned process did not save within %.0f s; stopping it", window_s(signum))
        child.kill()
        child.wait()
        code = None
    finally:
        _state.forwarding = False
    if code == SAVED_ON_NOTICE_EXIT:
        raise NoticeHonoured(signum)
    hand_on(signum)


def _start_deadline(signum: int) -> None:
    """Re-send the signal after the grace period, to be handed on then, saved or not."""
    def resend() -> None:
        if _state.requested == signum:
            _state.forced = True
            os.kill(os.getpid(), signum)

    timer = threading.Timer(window_s(signum), resend)
    timer.daemon = True
    timer.start()


def run_handing_on(fn: Callable[[], Any]) -> Any:
    """``fn()``; a run stopped by NoticeHonoured hands its signal on (submitit requeues, or the process exits)."""
    try:
        return fn()
    except NoticeHonoured as stopped:
        logger.warning("member stopped for its job's end: %s", stopped)
        hand_on(stopped.signum)
        raise
