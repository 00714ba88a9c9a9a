"""The control member of every generation, and re-evaluation with fresh seeds before export."""
from __future__ import annotations

import json
import statistics

import pytest
import torch

from meta.search.after.export import main as export_main
from meta.search.after.reevaluate import main as reevaluate_main
from meta.search.run import main
from mirror_maps import load_init
from core.records import MemberSpec
from results.store.run_store import RunStore

# noise: seed-to-seed spread of a "training run" (same params and seed, same fitness)
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "generations=2",
         "+inner.options={noise:0.05,count_calls:true}"]


def _run(run_dir, *extra):
    return main([f"run_dir={run_dir}", "new=true", *SYNTH, *extra])


def _spec(store: RunStore, generation: int, index: int) -> MemberSpec:
    return MemberSpec.from_dict(json.loads((store.member_dir(generation, index) / "spec.json").read_text()))


def test_the_control_member_trains_the_centre_with_the_generations_seed_and_stays_out_of_the_update(tmp_path):
    assert _run(tmp_path / "c", "reevaluate.top_k=0") == 0
    store = RunStore(tmp_path / "c")
    members = store.read_members().set_index(["generation", "index"])
    assert members.loc[(0, 4), "role"] == "control" and members.loc[(0, 0), "role"] == "member"
    assert len(members) == 10
    for generation in (0, 1):
        control = _spec(store, generation, 4)
        assert control.seed == _spec(store, generation, 0).seed  # common random numbers: the generation's seed
        centre = store.read_state(generation - 1)["center"] if generation else None
        if centre is not None:
            assert torch.equal(torch.tensor(control.params, dtype=torch.float64), centre)
        # every member's fitness is also shown relative to its generation's control
        row = members.loc[(generation, 1)]
        assert row["fitness_vs_control"] == pytest.approx(row["fitness"] - members.loc[(generation, 4), "fitness"])
    gens = store.read_generations().set_index("generation")
    assert gens.loc[1, "control_fitness"] == pytest.approx(members.loc[(1, 4), "fitness"])
    # The search itself is the same as without the control member.
    assert _run(tmp_path / "n", "reevaluate.top_k=0", "control_member=false") == 0
    plain = RunStore(tmp_path / "n")
    assert torch.equal(store.read_state(1)["center"], plain.read_state(1)["center"])
    assert len(plain.read_members()) == 8


def test_selection_retrains_top_members_and_centre_and_reporting_uses_other_seeds_for_every_row(tmp_path, capsys):
    assert _run(tmp_path, "reevaluate.top_k=2", "reevaluate.seeds=3", "reevaluate.report_seeds=3",
                "+inner.options.baseline_fitness={kl:0.3,prob_l2:0.2,base:0.1}",
                "+inner.options.evaluation_shift={test:-0.05}") == 0
    run_out = capsys.readouterr().out
    store = RunStore(tmp_path)
    summary = store.read_reevaluation()
    names = [c["name"] for c in summary["candidates"]]
    members = store.read_members()
    top = members[members["role"] == "member"].sort_values(["fitness", "generation", "index"],
                                                           ascending=[False, True, True]).head(2)
    assert names == [f"g{g:04d}_m{i:03d}" for g, i in zip(top["generation"], top["index"])] + ["center"]
    # 3 candidates x 3 seeds; the seeds are fresh (none a search seed) and shared by the candidates (paired)
    specs = [MemberSpec.from_dict(json.loads((store.reevaluate_dir() / f"member_{i:03d}" / "spec.json").read_text()))
             for i in range(9)]
    search_seeds = {_spec(store, g, 0).seed for g in (0, 1)}
    assert {s.seed for s in specs}.isdisjoint(search_seeds)
    assert [s.seed for s in specs[0:3]] == [s.seed for s in specs[3:6]] == [s.seed for s in specs[6:9]]
    for candidate in summary["candidates"]:
        assert candidate["n"] == 3 and candidate["std"] == pytest.approx(statistics.stdev(candidate["values"]))
    floor = summary["noise_floor_std"]
    bound = {c["name"]: c["mean"] - max(c["std"], floor) / 3 ** 0.5 for c in summary["candidates"]}
    assert summary["chosen"] == max(bound, key=bound.get) and floor > 0
    # Reporting: 8 rows x 3 seeds, the same 3 seeds for every row, none a search or selection seed
    folder = store.reevaluate_dir(reporting=True)
    report_specs = [MemberSpec.from_dict(json.loads((folder / f"member_{i:03d}" / "spec.json").read_text()))
                    for i in range(24)]
    assert not (folder / "member_024").exists()
    seeds = [s.seed for s in report_specs[0:3]]
    assert all([s.seed for s in report_specs[r * 3:r * 3 + 3]] == seeds for r in range(8))
    # the random-radius row trains a fresh map on each seed, none of them the start or another row's map
    radius_maps = [tuple(s.params) for s in report_specs[9:12]]
    assert len(set(radius_maps)) == 3 and tuple(report_specs[3].params) not in radius_maps
    assert set(seeds).isdisjoint(search_seeds | {s.seed for s in specs})
    assert report_specs[0].params == pytest.approx(summary["chosen_params"])  # the exported init is row 0
    # The table's numbers are the runs' own records
    table = store.read_result_table()
    assert [row["name"] for row in table["rows"]] == ["exported", "center", "nm_random", "radius_random", "kl",
                                                      "prob_l2", "none", "base"]
    for r, row in enumerate(table["rows"]):
        records = [json.loads((folder / f"member_{r * 3 + s:03d}" / "result.json").read_text()) for s in range(3)]
        fitness = [rec["fitness"] for rec in records]
        assert row["metrics"]["validation"]["mean"] == pytest.approx(statistics.fmean(fitness))
        assert row["metrics"]["validation"]["std"] == pytest.approx(statistics.stdev(fitness))
        assert row["metrics"]["test"]["mean"] == pytest.approx(statistics.fmean(
            rec["evaluations"]["test"]["pass_at_1"] for rec in records))
    assert table["rows"][4]["metrics"]["validation"]["mean"] == pytest.approx(0.3 + statistics.fmean(
        0.05 * __import__("random").Random(seed).gauss(0.0, 1.0) for seed in seeds))
    base_spec = report_specs[21]
    assert base_spec.inner["train"]["steps"] == 0 and base_spec.params == []
    kl_spec = report_specs[12]
    assert kl_spec.inner["divergence"]["name"] == "kl" and kl_spec.inner["divergence"]["coef"] == 0.04
    for suffix in (".md", ".csv", ".png"):
        assert (folder / f"result_table{suffix}").stat().st_size > 0
    markdown = (folder / "result_table.md").read_text()
    assert "NM-GRPO-ES (exported init) minus each baseline" in markdown
    assert len(table["verdict"]) >= 4 and all(sentence in markdown for sentence in table["verdict"])
    # meta.run and results.report end with the verdict's sentences
    assert run_out.rstrip().endswith("\n".join(table["verdict"]))
    from results.report.search.report import main as report_main

    assert report_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("\n".join(table["verdict"]))
    # export which=best: the selection stage's choice, with its numbers there and the table's rows and differences
    out = tmp_path / "best.safetensors"
    assert export_main([f"run_dir={tmp_path}", f"out={out}"]) == 0
    mirror_map, meta = load_init(out)
    chosen = next(c for c in summary["candidates"] if c["name"] == summary["chosen"])
    assert meta["which"] == "best" and meta["candidate"] == chosen["name"]
    assert (meta["selection_mean"], meta["selection_std"], meta["selection_n"]) == (
        pytest.approx(chosen["mean"]), pytest.approx(chosen["std"]), 3)
    assert [row["name"] for row in meta["result_table"]["rows"]] == [row["name"] for row in table["rows"]]
    assert {d["baseline"] for d in meta["result_table"]["exported_minus_baselines"] if d["metric"] == "validation"} \
        == {"center", "nm_random", "radius_random", "kl", "prob_l2", "none", "base"}
    assert meta["verdict"] == table["verdict"]
    assert torch.allclose(mirror_map.to_vector().double(), torch.tensor(summary["chosen_params"], dtype=torch.float64),
                          atol=1e-6)


def test_reevaluation_resumes_without_rerunning_and_a_changed_setting_starts_a_fresh_one(tmp_path):
    assert _run(tmp_path, "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=0") == 0
    store = RunStore(tmp_path)
    first = store.read_reevaluation()
    # Lose the summary and one run's result (killed mid-way): only that run trains again.
    store.reevaluation_path.unlink()
    (store.reevaluate_dir() / "member_001" / "result.json").unlink()
    assert reevaluate_main([f"run_dir={tmp_path}", "report_seeds=0"]) == 0
    calls = [len((store.reevaluate_dir() / f"member_{i:03d}" / "calls.log").read_text().splitlines())
             for i in range(4)]
    assert calls == [1, 2, 1, 1]
    assert store.read_reevaluation()["chosen"] == first["chosen"]
    # Other settings: the earlier runs are moved aside whole, never mixed in
    assert reevaluate_main([f"run_dir={tmp_path}", "seeds=3", "report_seeds=0"]) == 0
    assert (tmp_path / "reevaluation.old0" / "member_001" / "calls.log").exists()
    assert all(c["n"] == 3 for c in store.read_reevaluation()["candidates"])


def test_export_best_without_reevaluation_says_how_to_get_one(tmp_path, capsys):
    assert _run(tmp_path, "reevaluate.top_k=0", "generations=1") == 0
    assert export_main([f"run_dir={tmp_path}", f"out={tmp_path / 'x.safetensors'}"]) == 2
    assert "python -m meta.reevaluate" in capsys.readouterr().err


@pytest.mark.parametrize("override, fragment", [
    ("reevaluate.seeds=1", "reevaluate.seeds=1"), ("+reevaluate.topk=2", "reevaluate.topk"),
    ("quorum=0", "quorum=0"), ("quorum=1.5", "quorum=1.5"), ("straggler_grace=-1", "straggler_grace=-1"),
])
def test_bad_noise_and_quorum_settings_exit_2_before_anything_is_written(tmp_path, capsys, override, fragment):
    assert _run(tmp_path / "r", override) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_search_started_before_roles_existed_still_has_its_members_reevaluated(tmp_path):
    """Members tables written by earlier versions have no role column (and no control rows)."""
    import pandas as pd

    from meta.search.after.reevaluate import choose_candidates

    assert _run(tmp_path, "reevaluate.top_k=0", "control_member=false") == 0
    store = RunStore(tmp_path)
    old = store.read_members().drop(columns=["role"])
    old.to_parquet(store.members_table_path, index=False)
    store.upsert_members([{"generation": 1, "index": 9, "role": "control", "status": "ok", "fitness": 9.0}])
    assert pd.isna(store.read_members().set_index("index").loc[0, "role"]).all()
    names = [c["name"] for c in choose_candidates(store, 2)["candidates"]]
    assert len(names) == 3 and names[-1] == "center" and "g0001_m009" not in names


def test_export_best_names_a_damaged_reevaluation_file(tmp_path, capsys):
    assert _run(tmp_path, "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=0", "generations=1") == 0
    RunStore(tmp_path).reevaluation_path.write_text("{not json")
    assert export_main([f"run_dir={tmp_path}", f"out={tmp_path / 'x.safetensors'}"]) == 2
    err = capsys.readouterr().err
    assert "reevaluation.json" in err and "python -m meta.reevaluate" in err
