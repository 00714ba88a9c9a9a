"""The run store: checksummed state with fallback, population and job maps, idempotent tables."""
from __future__ import annotations

import logging

import pytest
import torch

from results.store.atomic import CorruptFileError
from results.store.run_store import RunStore


def test_latest_state_skips_a_corrupt_newest_file_with_a_warning(tmp_path, caplog):
    store = RunStore(tmp_path)
    store.write_state(0, {"x": torch.zeros(3)})
    store.write_state(1, {"x": torch.ones(3)})
    assert store.latest_state()[0] == 1
    path = store.state_path(1)
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    with caplog.at_level(logging.WARNING):
        generation, state = store.latest_state()
    assert generation == 0 and torch.equal(state["x"], torch.zeros(3))
    assert "corrupt" in caplog.text
    with pytest.raises(CorruptFileError):
        store.read_state(1)


def test_no_state_means_a_fresh_run(tmp_path):
    assert RunStore(tmp_path).latest_state() is None


def test_population_round_trip_and_corruption_is_not_trusted(tmp_path):
    store = RunStore(tmp_path)
    values = torch.randn(4, 380, dtype=torch.float64)
    store.write_population(3, values)
    assert torch.equal(store.read_population(3), values)
    assert store.read_population(4) is None
    store.population_path(3).write_bytes(b"not a torch file")
    assert store.read_population(3) is None


def test_jobs_map_round_trip(tmp_path):
    store = RunStore(tmp_path)
    assert store.read_jobs(0) == {}
    store.write_jobs(0, {2: {"job_id": "17", "attempt": 0}})
    assert store.read_jobs(0) == {2: {"job_id": "17", "attempt": 0}}


def test_table_upserts_replace_rows_of_a_repeated_generation(tmp_path):
    store = RunStore(tmp_path)
    store.upsert_members([{"generation": 0, "index": i, "fitness": 0.1 * i} for i in range(3)])
    store.upsert_members([{"generation": 0, "index": 1, "fitness": 0.9}, {"generation": 1, "index": 0, "fitness": 0.5}])
    table = store.read_members()
    assert len(table) == 4
    assert table.set_index(["generation", "index"]).loc[(0, 1), "fitness"] == pytest.approx(0.9)
    store.upsert_generation({"generation": 0, "mean_fitness": 0.1})
    store.upsert_generation({"generation": 0, "mean_fitness": 0.2})
    assert store.read_generations()["mean_fitness"].tolist() == [0.2]


def test_layout_matches_the_design(tmp_path):
    store = RunStore(tmp_path)
    assert store.state_path(7).relative_to(tmp_path).as_posix() == "state/gen_0007.pt"
    assert store.population_path(8).relative_to(tmp_path).as_posix() == "gen_0008/population.pt"
    assert store.jobs_path(8).relative_to(tmp_path).as_posix() == "gen_0008/jobs.json"
    assert store.member_dir(8, 17).relative_to(tmp_path).as_posix() == "gen_0008/member_017"
    assert store.members_table_path.relative_to(tmp_path).as_posix() == "tables/members.parquet"
