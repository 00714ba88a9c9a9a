"""One generation as a value (meta/search/generation/generation_shape.py): the dry-run plan and the run count the same jobs and
close at the same quorum count, with and without a control member, for odd and even populations and for an online
searcher's particles."""
from __future__ import annotations

import re

import pytest

from meta.search.run import main
from meta.search.generation.generation_shape import GenerationShape
from results.store.run_store import RunStore

# Members run one after another in-process (debug launcher), so with straggler_grace=0 a generation closes the moment
# its quorum count of members is final: the run's own count is read off closed.json and the member table.
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "generations=1", "reevaluate.top_k=0",
         "straggler_grace=0"]

CASES = {
    "pgpe_even_control": ["es=pgpe", "population=4", "quorum=0.5"],
    "snes_odd_control": ["es=snes", "population=5", "quorum=0.5"],
    "cem_odd_no_control": ["es=cem", "population=5", "quorum=0.7", "control_member=false"],
    "pgpe_even_all": ["es=pgpe", "population=6", "quorum=1.0"],
    "nres_particles": ["es=nres", "population=4", "quorum=0.5", "train.steps=8", "es.truncation_steps=4"],
}


def _plan_counts(text: str) -> tuple[int, int | None]:
    """(jobs per generation, the quorum count or None when every member is waited for) as the plan prints them."""
    online = re.search(r"member-steps: \d+ x 1 generations = (\d+) truncations", text)
    jobs = int(online.group(1)) if online else int(re.search(r"training runs: (\d+) per generation", text).group(1))
    quorum = re.search(r"after (\d+) of \d+ members finished", text)
    assert quorum or "every generation waits for all its members" in text
    return jobs, int(quorum.group(1)) if quorum else None


@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_and_the_run_count_the_same_jobs_and_the_same_quorum(case, tmp_path, capsys):
    overrides = [*SYNTH, *CASES[case]]
    assert main([f"run_dir={tmp_path / 'plan'}", "new=true", "dry_run=true", *overrides]) == 0
    planned_jobs, planned_quorum = _plan_counts(capsys.readouterr().out)

    assert main([f"run_dir={tmp_path / 'run'}", "new=true", *overrides]) == 0
    store = RunStore(tmp_path / "run")
    table = store.read_members()
    assert len(table) == len(store.read_jobs(0)) == planned_jobs  # every job the plan priced, and no other
    members = table[table["role"] == "member"]
    final = members[members["status"] != "late"]
    closed = store.read_closed(0)
    if planned_quorum is None:
        assert closed is None and len(final) == len(members)
    else:
        assert len(final) == closed["final_at_close"] == planned_quorum


def test_the_shape_counts_members_control_jobs_quorum_and_capacity():
    shape = GenerationShape.build(5, {"name": "snes", "ranking_method": "nes"}, control_member=True, quorum=0.5)
    assert (shape.jobs, shape.control_index, shape.quorum_count, shape.early_stop_capacity) == (6, 5, 3, 2)
    assert [shape.role(i) for i in range(6)] == ["member"] * 5 + ["control"]
    assert not shape.is_member(5) and shape.closes_early
    with pytest.raises(ValueError, match="member 6"):
        shape.role(6)
    # an online searcher's centre has no run to continue: no control member, whatever control_member says
    online = GenerationShape.build(4, {"name": "nres"}, control_member=True)
    assert (online.jobs, online.control_index, online.quorum_count, online.closes_early) == (4, None, 4, False)
    # a quorum that is a whole number of members in exact arithmetic is not rounded up by a float's last bit
    assert GenerationShape(10, quorum=0.7).quorum_count == 7 and GenerationShape(3, quorum=0.01).quorum_count == 1
