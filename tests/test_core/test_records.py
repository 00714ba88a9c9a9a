"""The member contract and crash-safe writes that every layer relies on."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

from results.store.atomic import (
    CorruptFileError,
    atomic_write_json,
    read_with_checksum,
    write_with_checksum,
)
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result, write_result


def test_result_record_round_trips_through_result_json(tmp_path):
    record = ResultRecord(status="ok", fitness=0.75, val_size=40, diagnostics={"reward_mean": 0.5}, steps_done=7)
    write_result(tmp_path, record)
    assert read_result(tmp_path) == record


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -math.inf])
def test_non_finite_fitness_becomes_a_failure_with_a_finite_value(bad):
    record = ResultRecord(status="ok", fitness=bad)
    assert record.status == "failed"
    assert record.fitness == 0.0
    assert "non-finite fitness" in record.error


def test_non_finite_diagnostics_are_dropped_so_json_stays_valid(tmp_path):
    record = ResultRecord(status="ok", fitness=1.0, diagnostics={"a": float("nan"), "b": 2.0})
    write_result(tmp_path, record)
    assert json.loads((tmp_path / "result.json").read_text())["diagnostics"] == {"b": 2.0}


def test_unknown_status_is_rejected():
    with pytest.raises(ValueError, match="status"):
        ResultRecord(status="finished")


def test_coerce_accepts_dicts_and_foreign_dataclasses():
    @dataclass
    class Outcome:
        status: str
        fitness: float

    assert ResultRecord.coerce({"status": "ok", "fitness": 0.5}).fitness == 0.5
    assert ResultRecord.coerce(Outcome("failed", 0.0)).status == "failed"
    with pytest.raises(TypeError):
        ResultRecord.coerce(0.5)


def test_unreadable_result_is_treated_as_unfinished(tmp_path):
    (tmp_path / "result.json").write_text('{"status": "ok", "fit')
    assert read_result(tmp_path) is None
    assert read_result(tmp_path / "missing") is None


def test_member_spec_requires_the_contract_keys():
    spec = MemberSpec(run_id="r", generation=1, index=2, seed=3, params=[0.0] * 380, work_dir="/w")
    assert MemberSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match="params"):
        MemberSpec.from_dict({"run_id": "r", "generation": 0, "index": 0, "seed": 0, "work_dir": "/w"})


def test_member_spec_dict_is_an_independent_copy():
    """A submitted spec dict must not change when the orchestrator later edits its spec (retries, attempts)."""
    spec = MemberSpec(run_id="r", generation=0, index=0, seed=0, params=[0.5] * 380, work_dir="/w",
                      inner={"options": {"lr": [1e-5]}})
    data = spec.to_dict()
    spec.params[0] = 9.0
    spec.inner["options"]["lr"].append(2e-5)
    assert data["params"][0] == 0.5 and data["inner"] == {"options": {"lr": [1e-5]}}
    assert sorted(data) == sorted(MemberSpec.__dataclass_fields__)


def test_checksummed_file_detects_corruption_and_missing_sidecar(tmp_path):
    path = write_with_checksum(tmp_path / "state.pt", b"payload")
    assert read_with_checksum(path) == b"payload"
    path.write_bytes(b"paylaod")
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        read_with_checksum(path)
    (tmp_path / "state.pt.sha256").unlink()
    with pytest.raises(CorruptFileError, match="missing"):
        read_with_checksum(path)


def test_atomic_write_leaves_no_temp_files_and_refuses_nan(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "b.json", {"x": float("nan")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_disk_peak_round_trips_and_older_records_still_load(tmp_path):
    record = ResultRecord(status="ok", fitness=0.5, disk_peak_bytes=3 * 2**30)
    write_result(tmp_path, record)
    assert json.loads((tmp_path / "result.json").read_text())["disk_peak_bytes"] == 3 * 2**30
    assert read_result(tmp_path) == record
    older = {"status": "ok", "fitness": 0.5, "val_size": 4, "diagnostics": {}, "wall_time_s": 1.0, "steps_done": 2,
             "error": ""}  # a result.json written before the field existed
    (tmp_path / "result.json").write_text(json.dumps(older))
    loaded = read_result(tmp_path)
    assert loaded is not None and loaded.fitness == 0.5 and loaded.disk_peak_bytes is None


@pytest.mark.parametrize("bad", [-1, float("nan"), "big", True])
def test_a_bad_disk_peak_is_dropped_not_a_lost_result(bad):
    record = ResultRecord(status="ok", fitness=0.5, disk_peak_bytes=bad)
    assert record.ok and record.disk_peak_bytes is None
