"""The fingerprint's comparison with several recorded machines (inner_loop/numerics/fingerprint.py): a machine
matches when every digest equals one recorded set, never by mixing sets; the differences named are the nearest set's."""
from __future__ import annotations

from inner_loop.numerics.fingerprint import OTHER_REFERENCES, compare, matched_cpus

AMD = {"cpu_vendor": "AuthenticAMD", "cpu_model": "AMD EPYC"}
INTEL = {"cpu_vendor": "GenuineIntel", "cpu_model": "Intel Xeon"}
RECORDED = {"warmup_weights": "a", "completions": "b", "final_weights": "c", "checked_on": [AMD],
            OTHER_REFERENCES: [{"warmup_weights": "x", "completions": "y", "final_weights": "z", "checked_on": [INTEL]}]}


def test_a_machine_matches_one_recorded_set_whole():
    assert compare({"warmup_weights": "a", "completions": "b", "final_weights": "c"}, RECORDED) == []
    assert matched_cpus({"warmup_weights": "x", "completions": "y", "final_weights": "z"}, RECORDED) == [INTEL]


def test_a_mix_of_two_sets_is_a_difference_named_against_the_nearest():
    found = {"warmup_weights": "a", "completions": "b", "final_weights": "z"}
    assert compare(found, RECORDED) == ["final_weights: this machine z, recorded c"]
    assert matched_cpus(found, RECORDED) == []
