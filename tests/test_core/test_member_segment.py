"""A member's work as a value (core/records.py Segment): the generation gives every member spec its segment, the
generation's stored state keeps it, and a spec stored before segments existed reads as it always meant."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from core.records import MemberSpec, Segment
from meta.search.run import main
from results.store.layout import SPEC_FILE
from results.store.run_store import RunStore
from results.store.truncation import NEXT_SEGMENTS_KEY, SEGMENTS_KEY, Truncation

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "reevaluate.top_k=0"]
H, K = 12, 4


def _spec(store: RunStore, generation: int, index: int) -> dict:
    return json.loads((store.member_dir(generation, index) / SPEC_FILE).read_text())


def _state(store: RunStore, generation: int) -> dict:
    return torch.load(store.state_path(generation), weights_only=True)


def test_whole_run_members_and_the_control_member_carry_their_es_member_steps(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "population=4", "generations=2", "train.steps=8",
                 "es.member_steps=4", "control_member=true"]) == 0
    store = RunStore(tmp_path)
    for generation in (0, 1):
        for index in range(5):  # the control member (index 4) trains as the population does
            spec = _spec(store, generation, index)
            assert spec["segment"] == {"start": 0, "stop": 4, "horizon": 4, "resume_from": None}
            assert spec["inner"]["train"]["steps"] == 4  # the schedule the segment's horizon names
        state = _state(store, generation)
        assert [entry["stop"] for entry in state[SEGMENTS_KEY]] == [4] * 5
        assert all(entry["run"] is None for entry in state[NEXT_SEGMENTS_KEY])


def test_an_nres_truncation_carries_its_steps_its_horizon_and_the_checkpoint_it_resumes_from(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "es=nres", "es.stagger=false", f"train.steps={H}",
                 f"es.truncation_steps={K}", "es.radius=0.01", "+inner.options={unrolled:{floor:0.5}}",
                 "population=4", "generations=2"]) == 0
    store = RunStore(tmp_path)
    for index in range(4):
        first = MemberSpec.from_dict(_spec(store, 0, index))
        second = MemberSpec.from_dict(_spec(store, 1, index))
        assert first.segment == Segment(0, K, H)  # from step 0: the untouched model, nothing to resume from
        piece = Truncation.of_spec(second)
        assert second.segment == Segment(K, 2 * K, H, str(piece.boundary(K)))
        assert second.truncation == {"particle": index, "episode": 0, "particle_dir": str(store.particle_dir(index))}
    state = _state(store, 1)
    assert [(e["start"], e["stop"], e["run"]) for e in state[NEXT_SEGMENTS_KEY]] == [
        (2 * K, 3 * K, {"particle": i, "episode": 0}) for i in range(4)]


def test_a_spec_stored_before_segments_reads_as_it_always_meant(tmp_path):
    base = {"run_id": "r", "generation": 0, "index": 1, "seed": 3, "params": [0.0], "work_dir": str(tmp_path),
            "inner": {"train": {"steps": 6}}}
    assert MemberSpec.from_dict(base).work == Segment(0, 6, 6)
    old_piece = {"particle": 1, "episode": 2, "start": 4, "stop": 8, "horizon": 12, "particle_dir": str(tmp_path)}
    old = MemberSpec.from_dict({**base, "inner": {"train": {"steps": 12}}, "truncation": old_piece})
    assert old.work == Segment(4, 8, 12)
    assert Truncation.of_spec(old) == Truncation.from_dict(old_piece)
    # a job pickled before the field existed: the instance has no segment of its own, the class default answers
    spec = MemberSpec.from_dict(base)
    del spec.__dict__["segment"]
    assert pickle.loads(pickle.dumps(spec)).work == Segment(0, 6, 6)
    # and a spec written now round-trips through its JSON
    spec = MemberSpec.from_dict({**base, "segment": {"start": 0, "stop": 3, "horizon": 3, "resume_from": None}})
    assert MemberSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).work == Segment(0, 3, 3)


@pytest.mark.parametrize("start, stop, horizon", [(2, 2, 4), (3, 2, 4), (0, 5, 4), (-1, 2, 4)])
def test_a_segment_that_cannot_be_trained_is_refused(start, stop, horizon):
    with pytest.raises(ValueError, match="0 <= start < stop <= horizon"):
        Segment(start, stop, horizon)
    assert Segment(0, 0, 0).steps == 0  # the base-model row: the untouched model, scored


def test_status_reads_the_stored_segments_not_a_searchers_private_state():
    source = (ROOT / "meta" / "status" / "view.py").read_text()
    assert '"searcher"' not in source and "'searcher'" not in source
