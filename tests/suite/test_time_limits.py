"""tests/time_limits.py: a command that keeps working is waited for however slow the machine, one that hangs is
stopped; the verdicts of the suite's long runs do not depend on the machine's speed."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from time_limits import run_with_progress, scaled, SLOWER

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\nprint('done')"


def test_a_silent_command_that_keeps_computing_is_not_stopped_at_its_quiet_limit():
    # 4 s of work with no output, watched with a 1.5 s quiet limit: its CPU time is its progress
    done = run_with_progress([sys.executable, "-c", BUSY.format(s=4)], quiet_s=1.5)
    assert done.returncode == 0 and done.stdout.strip() == "done"


def test_a_child_in_a_session_of_its_own_counts_as_progress():
    """The bench and the launchers start members in sessions of their own; the parent waits, idle, on them."""
    child = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY.format(s=4)!r}], "
             "start_new_session=True)")
    done = run_with_progress([sys.executable, "-c", child], quiet_s=1.5)
    assert done.returncode == 0 and done.stdout.strip() == "done"


def test_a_hung_command_is_stopped_with_its_output_so_far():
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_with_progress([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                          quiet_s=2)
    assert caught.value.output == "started\n"
    assert time.monotonic() - began < 60  # stopped once idle, not at the sleep's end


def test_a_fixed_wait_is_scaled_for_a_slower_machine():
    assert SLOWER >= 3 and scaled(10) == 10 * SLOWER
