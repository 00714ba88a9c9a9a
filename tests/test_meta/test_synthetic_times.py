"""The synthetic member's running-time options (the straggler benchmark's members): heavy tail, determinism."""
from __future__ import annotations

import math
import statistics

import pytest

from meta.synthetic import member_time_s
from core.records import MemberSpec


def _spec(generation: int, index: int) -> MemberSpec:
    return MemberSpec(run_id="r", generation=generation, index=index, seed=0, params=[0.0], work_dir="/nonexistent")


def test_times_are_log_normal_with_a_slow_tail_and_the_same_for_every_search():
    options = {"time_median_s": 10.0, "time_sigma": 0.5, "slow_fraction": 0.02, "slow_factor": 5.0}
    times = [member_time_s(_spec(g, i), options, 0.5) for g in range(10) for i in range(180)]
    assert times == [member_time_s(_spec(g, i), options, 0.5) for g in range(10) for i in range(180)]
    plain = sorted(t for t in times if t < 60)
    assert statistics.median(times) == pytest.approx(10.0, rel=0.1)
    logs = [math.log(t) for t in plain]
    assert statistics.stdev(logs) == pytest.approx(0.5, rel=0.15)
    slow = sum(1 for t in times if t > 10.0 * math.exp(3 * 0.5))  # beyond 3 sigma: essentially only the 5x ones
    assert 0.01 * len(times) < slow < 0.03 * len(times)


def test_time_can_track_fitness():
    options = {"time_median_s": 1.0, "time_sigma": 0.0, "time_tracks_fitness": 2.0}
    assert member_time_s(_spec(0, 0), options, 1.0) / member_time_s(_spec(0, 0), options, 0.0) == pytest.approx(
        math.exp(2.0))
