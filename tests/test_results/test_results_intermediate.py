"""intermediate.jsonl, what a member's intermediate validation leaves for the tuner's pruner: no value is half-read,
and none is lost to an earlier crash."""
from __future__ import annotations

from results.store.member_files import append_intermediate, read_intermediate
from results.store.layout import INTERMEDIATE_FILE


def test_values_are_read_back_in_step_order(tmp_path):
    assert read_intermediate(tmp_path) == {}
    append_intermediate(tmp_path, 10, 0.25, 64)
    append_intermediate(tmp_path, 5, 0.125, 64)
    assert read_intermediate(tmp_path) == {5: 0.125, 10: 0.25}


def test_a_line_torn_by_a_crash_is_skipped_and_the_next_append_is_still_read(tmp_path):
    append_intermediate(tmp_path, 5, 0.125, 64)
    with open(tmp_path / INTERMEDIATE_FILE, "a", encoding="utf-8") as handle:
        handle.write('{"step": 10, "pass_at_1": 0.')  # killed mid-write, no newline
    assert read_intermediate(tmp_path) == {5: 0.125}
    append_intermediate(tmp_path, 10, 0.375, 64)  # the member, retried, scores step 10 again
    assert read_intermediate(tmp_path) == {5: 0.125, 10: 0.375}


def test_a_step_scored_again_after_a_resume_keeps_the_latest_value(tmp_path):
    append_intermediate(tmp_path, 5, 0.125, 64)
    append_intermediate(tmp_path, 5, 0.5, 64)
    assert read_intermediate(tmp_path) == {5: 0.5}
