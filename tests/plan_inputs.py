"""The step time and GPU sharing at which the tests of the plan's arithmetic price the mbpp_qwen3 search.

Pinned on the command line so that those tests check the arithmetic, not whichever card measured the preset last:
the first H200 figure (15.0 s a step with the dynamic cache, one member per GPU). The preset's own figures are held
by tests/test_meta/settings/test_experiments.py."""
from __future__ import annotations

#: one member alone on its GPU at 15.0 s a step: 1600 steps + 12 min = 412 min a member
ONE_MEMBER_AT_15S = ["resources.step_time_s=15.0", "resources.members_per_gpu=1"]
#: the slowdown of two members sharing one card measured beside that figure
SHARED_AT_15S = [*ONE_MEMBER_AT_15S, "resources.shared_slowdown={2:1.183}"]
