"""results.report.search.report on synthetic ES run dirs: right numbers, live runs, corrupt files, real PNGs, CLI."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from results.store.provenance import write_run_manifest
from core.records import ResultRecord
from results.store.member_files import write_result
from results.report.search.report import build_report, main
from results.report.search.snapshot import load_run
from results.store.run_store import RunStore

DIM = 380
# generation -> per-member (status, fitness, response tokens); None = no result.json yet
PLAN = {
    0: [("ok", 0.1, 10.0), ("ok", 0.2, 20.0), ("ok", 0.3, 30.0), ("ok", 0.6, 40.0)],
    1: [("ok", 0.5, 10.0), ("ok", 0.7, 10.0), ("failed", 0.0, 0.0), ("ok", 0.9, 40.0)],
    2: [("ok", 0.8, 12.0), ("failed", 0.0, 0.0), None, None],
}
FINISHED = (0, 1)  # generations the orchestrator completed (tables + state)


def _population(generation: int) -> torch.Tensor:
    # member i is the constant vector (generation + i) / 100 -> per-coordinate std = std([0, .01, .02, .03])
    return torch.stack([torch.full((DIM,), (generation + i) / 100, dtype=torch.float64) for i in range(4)])


def write_synthetic_run(root) -> RunStore:
    store = RunStore(root)
    store.write_config("seed: 7\n")
    store.write_manifest({"run_id": "abc123", "config_hash": "cfg0123456789abc", "code_version": "deadbeef",
                          "seed": 7, "overrides": []})
    for generation, members in PLAN.items():
        store.write_population(generation, _population(generation))
        rows = []
        for index, outcome in enumerate(members):
            member_dir = store.member_dir(generation, index)
            if outcome is None:
                if index == 2:
                    member_dir.mkdir(parents=True)  # started, no result yet
                continue
            status, fitness, tokens = outcome
            record = ResultRecord(status=status, fitness=fitness, mean_response_tokens=tokens, wall_time_s=1.0,
                                  steps_done=3, error="boom" if status == "failed" else "")
            write_result(member_dir, record)
            rows.append({"generation": generation, "index": index, "status": status, "fitness": fitness,
                         "fitness_used": fitness, "mean_response_tokens": tokens, "wall_time_s": 1.0,
                         "steps_done": 3, "error": record.error})
        if generation in FINISHED:
            store.upsert_members(rows)
            store.upsert_generation({"generation": generation, "done": 3, "failed": 1, "wall_time_s": 42.0 + generation})
            store.write_state(generation, {"generation": generation, "center": torch.zeros(DIM)})
    write_run_manifest(store.member_dir(0, 0), {"kind": "es_member", "data_hashes": {"train": "aa", "validation": "bb"}})
    return store


@pytest.fixture
def run_dir(tmp_path):
    write_synthetic_run(tmp_path / "run")
    return tmp_path / "run"


def test_generation_table_values_from_a_run_in_progress(run_dir):
    snap = load_run(run_dir)
    gens = snap.generations.set_index("generation")
    assert list(gens.index) == [0, 1, 2]
    assert gens.loc[0, "mean_fitness"] == pytest.approx(0.3)
    assert gens.loc[0, "median_fitness"] == pytest.approx(0.25)
    assert gens.loc[0, "max_fitness"] == pytest.approx(0.6)
    assert gens.loc[0, "std_fitness"] == pytest.approx(np.std([0.1, 0.2, 0.3, 0.6], ddof=1))
    assert gens.loc[0, "mean_response_tokens"] == pytest.approx(25.0)
    # failures are counted, not averaged in as zeros
    assert (gens.loc[1, "ok"], gens.loc[1, "failed"]) == (3, 1)
    assert gens.loc[1, "mean_fitness"] == pytest.approx(0.7)
    assert gens.loc[1, "mean_response_tokens"] == pytest.approx(20.0)
    assert gens.loc[0, "search_spread"] == pytest.approx(np.std([0, 0.01, 0.02, 0.03], ddof=1))
    assert gens.loc[0, "wall_time_s"] == pytest.approx(42.0)
    assert list(gens["state"]) == ["done", "done", "in progress"]
    # the live generation: one ok, one failed, one started without result, one never started
    assert (gens.loc[2, "ok"], gens.loc[2, "failed"], gens.loc[2, "pending"], gens.loc[2, "members"]) == (1, 1, 2, 4)
    assert gens.loc[2, "max_fitness"] == pytest.approx(0.8)
    assert gens.loc[2, "wall_time_s"] >= 0  # elapsed since the population was written
    assert snap.skipped == []
    assert snap.data_hashes == ["train:aa,validation:bb"]


def test_report_writes_tables_with_provenance_and_lists_top_members(run_dir, tmp_path, capsys):
    assert main([str(run_dir), "--out", str(tmp_path / "out"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "generations:" in text and "in progress" in text and "cfg0123456789abc" in text
    top = pd.read_csv(tmp_path / "out" / "top_members.csv")
    assert top[["generation", "index"]].values.tolist() == [[1, 3], [2, 0], [1, 1]]
    assert top["fitness"].tolist() == pytest.approx([0.9, 0.8, 0.7])
    gens = pd.read_csv(tmp_path / "out" / "generations.csv")
    for column, value in (("run_id", "abc123"), ("config_hash", "cfg0123456789abc"), ("code_version", "deadbeef"),
                          ("seed", 7), ("data_hashes", "train:aa,validation:bb")):
        assert (gens[column] == value).all(), column
    members = pd.read_csv(tmp_path / "out" / "members.csv")
    assert len(members) == 12
    assert members.set_index(["generation", "index"]).loc[(2, 3), "status"] == "pending"


def _assert_real_png(path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert 600 <= image.size[0] <= 900 and 350 <= image.size[1] <= 450  # the axes and a legend beside them
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    # not blank: many pixels differ from the background, and more than two colours are drawn
    background = pixels[0, 0]
    assert (np.abs(pixels - background).sum(axis=2) > 30).mean() > 0.02
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20


def _set_disk(run_dir, generation: int, peaks: list) -> None:
    """Rewrite the members' result.json with these peaks (None: an older record without the field)."""
    for index, peak in enumerate(peaks):
        path = RunStore(run_dir).member_dir(generation, index) / "result.json"
        data = json.loads(path.read_text())
        data.pop("disk_peak_bytes", None)
        if peak is not None:
            data["disk_peak_bytes"] = peak
        path.write_text(json.dumps(data))


def test_plots_are_real_non_blank_images(run_dir, tmp_path):
    _set_disk(run_dir, 0, [2**30, 2**31, 3 * 2**30, 2**30])
    _set_disk(run_dir, 1, [2**31, 2**31, 2**29, 2**31])
    report = build_report(run_dir, tmp_path / "out")
    pngs = [p for p in report.files if p.suffix == ".png"]
    assert sorted(p.name for p in pngs) == ["disk.png", "failures.png", "fitness.png", "fitness_vs_control.png",
                                                "response_length.png"]
    for png in pngs:
        _assert_real_png(png)


def test_corrupt_files_are_skipped_and_named(run_dir, tmp_path, capsys):
    store = RunStore(run_dir)
    store.members_table_path.write_bytes(b"PAR1 this is not parquet")
    (store.member_dir(2, 1) / "result.json").write_text("{ not json")
    state = store.state_path(1)
    state.write_bytes(state.read_bytes()[:-5] + b"xxxxx")
    store.manifest_path.write_text("{")

    assert main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    snap = load_run(run_dir)
    text = "\n".join(snap.skipped)
    assert "members.parquet" in text and "rebuilt from result.json" in text
    assert "member_001/result.json" in text
    assert "gen_0001.pt" in text
    assert "manifest.json" in text
    assert "skipped (4)" in out
    gens = snap.generations.set_index("generation")
    # members come back from result.json; the corrupt state makes generation 1 not done
    assert gens.loc[0, "mean_fitness"] == pytest.approx(0.3)
    assert gens.loc[1, "state"] != "done" and gens.loc[1, "failed"] == 1
    assert (gens.loc[2, "unreadable"], gens.loc[2, "failed"]) == (1, 0)
    assert (tmp_path / "out" / "skipped.txt").read_text().count("\n") == 4


def test_not_a_run_dir_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "not an ES run directory" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report").exists()


def test_report_agrees_with_the_orchestrators_own_tables(tmp_path):
    from meta.search.run import main as meta_main

    run = tmp_path / "es"
    assert meta_main(["inner.entrypoint=meta.synthetic:member", "launcher=debug", "population=4", "generations=2",
                      f"run_dir={run}", "new=true", "+inner.options.fail=['1:2']", "max_failed_fraction=0.5", "retries=0"]) == 0
    report = build_report(run)
    ours = report.generations.set_index("generation")
    theirs = RunStore(run).read_generations().set_index("generation")
    assert list(ours.index) == [0, 1] and (ours["state"] == "done").all()
    assert ours["max_fitness"].tolist() == pytest.approx(theirs["best_fitness"].tolist())
    assert ours["failed"].tolist() == theirs["failed"].tolist() == [0, 1]
    assert report.provenance["config_hash"] == json.loads((run / "manifest.json").read_text())["config_hash"]
    for png in (p for p in report.files if p.suffix == ".png"):
        _assert_real_png(png)


def test_disk_per_generation_from_result_files(run_dir, tmp_path, capsys):
    """Peak disk per member comes from result.json (the orchestrator's table need not carry it); a generation
    shows max / mean over the members that measured it and their sum; older records without it count as unknown."""
    gib = 2**30
    _set_disk(run_dir, 0, [1 * gib, 2 * gib, 3 * gib, None])  # member 3: an older result.json
    assert main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    gens = pd.read_csv(tmp_path / "out" / "generations.csv").set_index("generation")
    assert gens.loc[0, "disk_peak_max"] == 3 * gib
    assert gens.loc[0, "disk_peak_mean"] == pytest.approx(2 * gib)
    assert gens.loc[0, "disk_peak_sum"] == 6 * gib
    assert pd.isna(gens.loc[1, "disk_peak_max"])  # nothing measured there
    members = pd.read_csv(tmp_path / "out" / "members.csv").set_index(["generation", "index"])
    assert members.loc[(0, 2), "disk_peak_bytes"] == 3 * gib and pd.isna(members.loc[(0, 3), "disk_peak_bytes"])
    assert "gen 0: per member max 3.0 GiB, mean 2.0 GiB; generation sum 6.0 GiB (3/4 members measured)" in text
    assert "gen 1: per member max n/a" in text


def test_format_bytes_picks_readable_units():
    from results.report.search.report import format_bytes

    assert [format_bytes(v) for v in (0, 1023, 1536, 5 * 2**20, 2.4e12, None, float("nan"))] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "2.2 TiB", "n/a", "n/a"]


def _noise_lines(run_dir) -> dict[str, str]:
    """The last noise line that mentions each key (the result table's pooled noise comes after the selection's)."""
    from results.report.search.report import format_noise

    lines = format_noise(load_run(run_dir))
    return {key: [line for line in lines if key in line][-1] for key in ("one init", "ratio across-members")}


def test_the_signal_ratio_uses_every_seed_of_the_searchs_own_inits_once_the_result_table_exists(run_dir):
    """Three inits x 2 selection seeds can agree by chance (std ~0.01, measured) while the same inits spread by
    ~0.09 over the reporting seeds: the ratio divided by the first claimed signal the second shows is noise."""
    store = RunStore(run_dir)
    selection = [{"name": name, "values": values, "n": 2, "mean": sum(values) / 2, "std": 0.0, "failed": 0,
                  "search_fitness": 0.5, "lower_bound": 0.4}
                 for name, values in (("g0001_m003", [0.40, 0.41]), ("g0001_m001", [0.38, 0.39]),
                                      ("center", [0.20, 0.21]))]
    store.write_reevaluation({"seeds": 2, "candidates": selection, "chosen": "g0001_m003",
                              "noise_floor_std": 0.0071})
    across = load_run(run_dir).generations["std_fitness"].median()
    before = _noise_lines(run_dir)
    assert f"{across / 0.0071:.2f}" in before["ratio across-members"]  # no result table yet: the selection's figure

    def row(name: str, divergence: str, values: list[float]) -> dict:
        return {"name": name, "divergence": divergence,
                "metrics": {"validation": {"values": {str(s): v for s, v in enumerate(values)}}}}

    store.write_result_table({"rows": [row("exported", "neural_mirror", [0.30, 0.50, 0.40, 0.20]),
                                       row("center", "neural_mirror", [0.10, 0.30, 0.20, 0.20]),
                                       row("kl", "kl", [0.0, 0.9, 0.0, 0.9]),  # another regularizer: not one init
                                       row("base", "none", [0.35, 0.35, 0.35, 0.35])]})
    after = _noise_lines(run_dir)
    groups = [[0.30, 0.50, 0.40, 0.20], [0.10, 0.30, 0.20, 0.20], *[c["values"] for c in selection]]
    mean = [sum(g) / len(g) for g in groups]
    pooled = (sum((x - m) ** 2 for g, m in zip(groups, mean) for x in g) / sum(len(g) - 1 for g in groups)) ** 0.5
    assert "2 neural_mirror rows" in after["one init"] and f"std {pooled:.4f}" in after["one init"]
    assert f"{across / pooled:.2f}" in after["ratio across-members"]
