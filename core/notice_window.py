"""How long a member may take, after its job's end notice, to finish its step and save: the one owner of that number.

Why here: the member (inner_loop/process/notice.py) waits that long for its step, and the packed task that runs it
(launch/slurm/packed.py) kills it a little after; two numbers kept apart drifted (25 s and 30 s) while the time-limit
warning comes ``launcher.signal_delay_s`` (120 s) before the limit. A step longer than 25 s (an A100 at 1.5-2x an
H200's 15 s, x1.18 with two members on the card) then never saved on that warning. The window follows the notice:

- USR2, the time-limit warning: ``launcher.signal_delay_s`` before the limit. The launcher puts the delay it asked
  sbatch for into the job's environment (SIGNAL_DELAY_ENV); the window is that less HAND_ON_S for what follows the
  save (submitit's requeue command, the process's exit) and TASK_MARGIN_S, so that a packed task, which waits its
  members' window and that margin, still requeues before the limit.
- SIGTERM (a requeue, a preemption, a cancel): SLURM kills the job ``KillWait`` seconds later (30 s by default,
  a setting of the cluster the job cannot read), so the window is KILL_WAIT_S less HAND_ON_S.

Standard library only: every job process imports it.
"""
from __future__ import annotations

import os
import signal

#: the job's environment variable in which the SLURM launcher passes the seconds between the time-limit warning
#: and the limit (``launcher.signal_delay_s``, as the launcher gave it to sbatch for this array)
SIGNAL_DELAY_ENV = "MIRROR_ES_SIGNAL_DELAY_S"
#: SLURM's default KillWait: seconds between a SIGTERM and the SIGKILL that follows it
KILL_WAIT_S = 30.0
#: seconds kept, after the save, for handing the notice on (submitit's scontrol requeue, the process's exit)
HAND_ON_S = 5.0
#: seconds a packed task waits for its members beyond their own window before it kills them
TASK_MARGIN_S = 5.0
#: the least a save on a notice is expected to need beside the step (a LoRA checkpoint of Qwen3-1.7B and Adam's
#: state: a few hundred MB); the dry-run plan warns when the warning cannot cover a step plus this
SAVE_ALLOWANCE_S = 15.0


def signal_delay_s(environ: dict[str, str] | None = None) -> float | None:
    """The seconds between this job's time-limit warning and its limit, as the launcher passed them; None outside
    such a job (or when the value is unreadable)."""
    value = (os.environ if environ is None else environ).get(SIGNAL_DELAY_ENV, "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def save_window_s(signum: int, delay_s: float | None = None) -> float:
    """Seconds a member waits, after notice ``signum``, for its step to end and its checkpoint to be written.

    ``delay_s``: the time-limit warning's lead (default: this job's, ``signal_delay_s()``). USR2 gets that lead less
    HAND_ON_S and TASK_MARGIN_S, at least what a SIGTERM gets; any other notice gets KILL_WAIT_S less HAND_ON_S."""
    kill_wait = KILL_WAIT_S - HAND_ON_S
    if signum != signal.SIGUSR2:
        return kill_wait
    lead = signal_delay_s() if delay_s is None else delay_s
    return max(kill_wait, lead - HAND_ON_S - TASK_MARGIN_S) if lead else kill_wait


def task_grace_s(signum: int, delay_s: float | None = None) -> float:
    """Seconds a packed task gives its members after notice ``signum`` before it kills them: their window and a
    margin for their own hand-on."""
    return save_window_s(signum, delay_s) + TASK_MARGIN_S


def notice_shortfall(step_s: float, delay_s: float) -> str:
    """Why a time-limit warning ``delay_s`` before the limit cannot cover a step of ``step_s`` and a save (naming
    ``launcher.signal_delay_s`` and the figure that would); "" when it can."""
    needed = step_s + SAVE_ALLOWANCE_S + HAND_ON_S + TASK_MARGIN_S
    if delay_s >= needed:
        return ""
    return (f"launcher.signal_delay_s={delay_s:g} s cannot cover a step ({step_s:g} s) and a save "
            f"(~{SAVE_ALLOWANCE_S:g} s) before the time limit: a member warned of its limit loses up to "
            f"train.save_every steps. Set launcher.signal_delay_s to at least {int(needed + 0.999):d}")
