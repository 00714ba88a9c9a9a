"""Straggler-tolerant generations: closing at the quorum, late members, and exact resume of a closed generation."""
from __future__ import annotations

import json
import time

import pandas as pd
import pytest
import torch

from launch.local.controllers import controller_running
from meta.search.generation.generation_close import QuorumClock
from meta.search.generation.generation_shape import GenerationShape
from meta.search.run import main
from core.records import ResultRecord
from results.store.member_files import read_result, write_result
from results.store.run_store import RunStore
from time_limits import scaled

# Members run one after another in-process (debug launcher), so "members 0-3 finished, 4-7 pending" is exact.
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=8", "generations=2",
         "reevaluate.top_k=0", "+inner.options={count_calls:true}"]


def _run(run_dir, *extra):
    return main([f"run_dir={run_dir}", "new=true", *SYNTH, *extra])


def _calls(store: RunStore, generation: int, index: int) -> int:
    path = store.member_dir(generation, index) / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_quorum_clock_waits_the_grace_relative_to_the_median_time():
    now = [100.0]
    clock = QuorumClock(GenerationShape(population=4, control=True, quorum=0.5), grace=0.5, _now=lambda: now[0])
    final = {0: ResultRecord(status="ok", fitness=0.1, wall_time_s=10.0)}
    assert clock.late_members(final, [1, 2, 3]) == []  # 1 of 2 needed
    final[1] = ResultRecord(status="ok", fitness=0.2, wall_time_s=30.0)
    assert clock.late_members(final, [2, 3]) == []  # quorum reached now; grace = 0.5 x median 20 s = 10 s
    now[0] = 109.9
    assert clock.late_members(final, [2, 3]) == []
    now[0] = 110.0
    assert clock.late_members(final, [2, 3]) == [2, 3]
    # the control member (index == population) never counts toward the quorum
    assert QuorumClock(GenerationShape(4, True, 0.5), 0.0).late_members({0: final[0], 4: final[1]}, [1, 2, 3]) == []
    assert not QuorumClock(GenerationShape(4, True, 1.0), 0.0).enabled()


def test_a_generation_closes_at_its_quorum_and_late_members_stay_out_of_the_update(tmp_path):
    assert _run(tmp_path / "q", "quorum=0.5", "straggler_grace=0") == 0
    store = RunStore(tmp_path / "q")
    members = store.read_members().set_index(["generation", "index"])
    for generation in (0, 1):
        closed = store.read_closed(generation)
        assert closed["late"] == [4, 5, 6, 7, 8]  # 4 of 8 final, grace 0: the rest (and the control) are late
        for index in range(4, 9):
            assert members.loc[(generation, index), "status"] == "late"
            assert pd.isna(members.loc[(generation, index), "fitness_used"])
            assert _calls(store, generation, index) == 0  # cancelled before it ran
    gens = store.read_generations().set_index("generation")
    assert gens.loc[0, "late"] == 4 and gens.loc[0, "done"] == 4
    # The update differs from the full generation's: late members carried no information into it.
    assert _run(tmp_path / "full") == 0
    full = RunStore(tmp_path / "full")
    assert not torch.equal(store.read_state(0)["center"], full.read_state(0)["center"])
    assert full.read_closed(0) is None


def test_a_closed_generation_resumes_as_closed_even_if_a_late_member_wrote_a_result(tmp_path):
    """Killed after closed.json, before the state: the resume settles the same members late, so the update is
    the one the first process would have made, whatever a cancelled member managed to write."""
    assert _run(tmp_path / "ref", "quorum=0.5", "straggler_grace=0", "generations=1") == 0
    assert _run(tmp_path / "crash", "quorum=0.5", "straggler_grace=0", "generations=1") == 0
    store = RunStore(tmp_path / "crash")
    # Undo the tell and the tables, as a crash right after the close would have left it...
    store.state_path(0).unlink()
    store.state_path(0).with_name(store.state_path(0).name + ".sha256").unlink()
    store.members_table_path.unlink()
    # ...and a late member that finished on its node anyway (its own record replaces the late one).
    write_result(store.member_dir(0, 5), ResultRecord(status="ok", fitness=0.99, wall_time_s=1.0))
    assert _run(tmp_path / "crash", "quorum=0.5", "straggler_grace=0", "generations=1") == 0
    ref = RunStore(tmp_path / "ref")
    assert torch.equal(store.read_state(0)["center"], ref.read_state(0)["center"])
    assert store.read_members().set_index("index").loc[5, "status"] == "late"
    assert read_result(store.member_dir(0, 5)).fitness == 0.99  # the file is left as the member wrote it
    assert _calls(store, 0, 5) == 0


def test_quorum_one_waits_for_every_member_as_before(tmp_path):
    assert _run(tmp_path, "generations=1") == 0
    store = RunStore(tmp_path)
    assert store.read_closed(0) is None
    assert set(store.read_members()["status"]) == {"ok"}


def test_a_hung_member_is_cancelled_as_late_instead_of_holding_the_generation(tmp_path):
    """Local processes: one member hangs; the generation closes 3 of 4 + grace later, long before the member's
    time limit, and its process is gone."""
    started = time.monotonic()
    assert main([f"run_dir={tmp_path}", "new=true", "launcher=local", "inner.entrypoint=meta.synthetic:member",
                 "population=4", "generations=1", "reevaluate.top_k=0", "control_member=false", "quorum=0.75",
                 "straggler_grace=1.0", "inner.timeout_s=600", "+inner.options={hang:[2],sleep_s:0.5}"]) == 0
    assert time.monotonic() - started < 120
    store = RunStore(tmp_path)
    assert store.read_closed(0)["late"] == [2]
    assert read_result(store.member_dir(0, 2)).status == "late"
    jobs = json.loads(store.jobs_path(0).read_text())["members"]
    controller = jobs["2"]["job_id"]  # the member's local controller process (a zombie once dead counts as dead)
    deadline = time.monotonic() + scaled(30)
    while controller_running(controller) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not controller_running(controller), f"the late member's process {controller} is still running"
