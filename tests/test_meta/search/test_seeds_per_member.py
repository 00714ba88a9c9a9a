"""seeds_per_member: every member of a generation trains on the same k seeds; its fitness is their mean."""
from __future__ import annotations

import json
import random
import statistics

import pytest
import yaml

from meta.search.config import config_hash
from meta.compose import compose
from meta.search.run import main
from core.records import MemberSpec
from results.store.member_files import read_result
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4",
         "+inner.options={noise:0.05,count_calls:true}"]


def test_members_share_their_generations_seeds_and_score_the_mean(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "generations=2", "seeds_per_member=3", "reevaluate.top_k=1",
                 "reevaluate.seeds=2", "reevaluate.report_seeds=0"]) == 0
    store = RunStore(tmp_path)
    members = store.read_members().set_index(["generation", "index"])
    for generation in (0, 1):
        seeds = None
        for index in range(5):  # the population and the control member
            folder = store.member_dir(generation, index)
            runs = [read_result(folder / f"seed_{k:02d}") for k in range(3)]
            assert all(r is not None and r.ok for r in runs) and not (folder / "seed_03").exists()
            assert members.loc[(generation, index), "fitness"] == pytest.approx(statistics.fmean(r.fitness for r in runs))
            spec_seeds = [json.loads((folder / f"seed_{k:02d}" / "spec.json").read_text())["seed"] for k in range(3)]
            assert len(set(spec_seeds)) == 3 and spec_seeds == (seeds or spec_seeds)  # common random numbers
            seeds = spec_seeds
            for k, seed in enumerate(spec_seeds):  # each run is a real member run with its own seed's noise
                noise = 0.05 * random.Random(seed).gauss(0.0, 1.0)
                assert (folder / f"seed_{k:02d}" / "calls.log").read_text().splitlines() == ["attempt 0"]
                assert runs[k].fitness - noise == pytest.approx(runs[0].fitness - 0.05 * random.Random(
                    spec_seeds[0]).gauss(0.0, 1.0))
        if generation == 0:
            first = seeds
    assert first != seeds  # fresh seeds per generation
    # The first seed is the one a single-seed search uses: seeds_per_member=1 runs are unchanged
    single = tmp_path.parent / "single"
    assert main([f"run_dir={single}", "new=true", *SYNTH, "generations=1", "reevaluate.top_k=0"]) == 0
    assert MemberSpec.from_dict(json.loads((RunStore(single).member_dir(0, 0) / "spec.json").read_text())).seed == first[0]
    # Re-evaluation runs are single runs on their own seeds, whatever seeds_per_member says
    spec = json.loads((store.reevaluate_dir() / "member_000" / "spec.json").read_text())
    assert "member_seeds" not in spec["inner"] and not (store.reevaluate_dir() / "member_000" / "seed_00").exists()


def test_a_lost_seed_run_is_the_only_one_run_again(tmp_path):
    args = [f"run_dir={tmp_path}", "new=true", *SYNTH, "generations=1", "seeds_per_member=3", "reevaluate.top_k=0"]
    assert main(args) == 0
    store = RunStore(tmp_path)
    member = store.member_dir(0, 1)
    before = read_result(member).fitness
    (member / "result.json").unlink()  # the member's mean and one seed's run were lost (killed mid-write)
    (member / "seed_01" / "result.json").unlink()
    store.state_path(0).unlink()
    assert main(args) == 0
    calls = [len((member / f"seed_{k:02d}" / "calls.log").read_text().splitlines()) for k in range(3)]
    assert calls == [1, 2, 1] and read_result(member).fitness == pytest.approx(before)


def test_a_hung_seed_makes_its_member_late_at_the_quorum(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", "launcher=local", "inner.entrypoint=meta.synthetic:member", "population=4",
                 "generations=1", "reevaluate.top_k=0", "control_member=false", "quorum=0.75",
                 "straggler_grace=1.0", "inner.timeout_s=600", "seeds_per_member=2",
                 "+inner.options={hang:[2],sleep_s:0.2}"]) == 0
    store = RunStore(tmp_path)
    assert store.read_closed(0)["late"] == [2] and read_result(store.member_dir(0, 2)).status == "late"
    assert all(read_result(store.member_dir(0, i)).ok for i in (0, 1, 3))


def test_changing_seeds_per_member_on_resume_is_refused_and_old_runs_resume(tmp_path, capsys):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "generations=1", "reevaluate.top_k=0"]) == 0
    assert main([f"run_dir={tmp_path}", "new=true", "generations=2", "seeds_per_member=2"]) == 2
    assert "seeds_per_member: 1 -> 2" in capsys.readouterr().err
    # A run written before the setting existed has no seeds_per_member in its config: it resumes as 1
    store = RunStore(tmp_path)
    stored = yaml.safe_load(store.read_config_text())
    del stored["seeds_per_member"]
    store.write_config(yaml.safe_dump(stored))
    assert main([f"run_dir={tmp_path}", "new=true", "generations=2"]) == 0
    raw = compose([])
    assert config_hash(raw) == config_hash({k: v for k, v in raw.items() if k != "seeds_per_member"})
    assert config_hash(raw) != config_hash({**raw, "seeds_per_member": 2})


def test_a_seed_that_recorded_its_own_failure_is_run_again_when_the_member_is_retried(tmp_path):
    """A seed's entry point that writes its failed record itself (train_member does) left it final: the member's
    retry re-read it and failed again without running the seed."""
    assert main([f"run_dir={tmp_path}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4",
                 "generations=1", "seeds_per_member=2", "retries=1", "reevaluate.top_k=0",
                 "+inner.options={nan_fitness:['0:1'],fail_attempts:1,count_calls:true}"]) == 0
    store = RunStore(tmp_path)
    folder = store.member_dir(0, 1)
    assert read_result(folder).ok
    assert (folder / "seed_00" / "calls.log").read_text().splitlines() == ["attempt 0", "attempt 1"]
    archived = json.loads((folder / "seed_00" / "result.attempt0.json").read_text())  # attempt 0's, moved aside
    assert archived["status"] == "failed"
    assert (folder / "seed_01" / "calls.log").read_text().splitlines() == ["attempt 1"]
