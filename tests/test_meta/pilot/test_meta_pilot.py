"""meta.pilot on this machine with the synthetic member: the SNR estimate against its analytic value, no signal, the
recommendation, dry run, bad input, the design (seeds, directions, coefs), kill and resume, export and the report."""
from __future__ import annotations

import json
import math
import os
import runpy
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meta.compose import CONF_DIR, compose
from meta.settings.schema import searcher_settings
from meta.pilot.cli import main
from meta.searchers import build_searcher
from meta.synthetic import member as synthetic_member
from results.report.pilot import format_pilot, is_pilot_dir
from core.records import MemberSpec
from results.store.run_store import RunStore
from helpers import wait_for_file

ROOT = Path(__file__).resolve().parents[3]
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member"]
SLOPE, PARAM_NOISE, RADIUS, POPULATION = 10.0, 0.05, 0.01, 4
#: what the fixed-seed numbers below depend on, pinned against changes of the defaults
PINNED = ["es=pgpe", f"es.radius={RADIUS}", "init=uniform"]
# f(x, s) = base + SLOPE w.(x - target) + noise g(s) + PARAM_NOISE h(s, x), w a unit vector, g, h ~ N(0, 1):
#   d_is = f(c + e_i, s) - f(c - e_i, s) = 2 SLOPE w.e_i + PARAM_NOISE (h(s, c+e_i) - h(s, c-e_i))   (g(s) cancels)
#   w.e_i ~ N(0, RADIUS^2)  =>  sigma_s^2 = 4 SLOPE^2 RADIUS^2 = 4 * 100 * 1e-4 = 0.04
#   sigma_n^2 = 2 PARAM_NOISE^2 = 0.005
#   SNR = (P/2) sigma_s^2 / (sigma_n^2 / r) = (4/2) * 0.04 / 0.005 = 16   (r = 1)
ANALYTIC_SIGNAL, ANALYTIC_NOISE = 4 * SLOPE**2 * RADIUS**2, 2 * PARAM_NOISE**2
ANALYTIC_SNR = POPULATION / 2 * ANALYTIC_SIGNAL / ANALYTIC_NOISE
SLOPE_OPTIONS = (f"+inner.options={{slope: {SLOPE}, param_noise: {PARAM_NOISE}, noise: 0.1, val_size: 200, "
                 "count_calls: true}")
# 100 pairs x 2 seeds: the signal variance's relative standard error is about sqrt(2/100) = 0.14, the noise
# variance's (100 dof) as much, so the SNR is within +-30% at about 1.5 standard errors; seeds 0..3 gave 16.5, 17.0,
# 16.8, 21.3
SLOPE_ARGS = [*SYNTH, *PINNED, SLOPE_OPTIONS, f"population={POPULATION}", "pilot.seeds=2",
              "pilot.pairs=100", "seed=0"]


def _summary(run_dir: Path) -> dict:
    summary = RunStore(run_dir).read_pilot()
    assert summary is not None and summary["complete"]
    return summary


def _calls(run_dir: Path) -> list[list[str]]:
    plan = RunStore(run_dir).read_pilot_plan()
    return [(Path(m["work_dir"]) / "calls.log").read_text().splitlines() for m in plan["members"]]


@pytest.fixture(scope="module")
def slope_pilot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("slope") / "pilot"
    assert main([f"run_dir={run_dir}", "new=true", *SLOPE_ARGS]) == 0
    return run_dir


def test_the_snr_estimate_is_within_30_percent_of_the_analytic_value(slope_pilot):
    (combo,) = _summary(slope_pilot)["combinations"]
    assert combo["signal"] and combo["p_value"] < 0.05
    assert combo["noise_var"] == pytest.approx(ANALYTIC_NOISE, rel=0.3)
    assert combo["signal_var"] == pytest.approx(ANALYTIC_SIGNAL, rel=0.3)
    assert combo["snr"] == pytest.approx(ANALYTIC_SNR, rel=0.3)
    # the centre's seed noise is the shared noise and the per-params noise together; V is the records' val_size
    centre = combo["centre"]
    assert centre["n"] == 2 and centre["val_size"] == 200 and centre["val_size_halving_binomial"] == 800
    p = centre["mean"]
    assert centre["binomial_std"] == pytest.approx(math.sqrt(p * (1 - p) / 200))
    training = math.sqrt(max(centre["total_std"] ** 2 - centre["binomial_std"] ** 2, 0))
    assert centre["training_std"] == pytest.approx(training)


def test_every_init_trains_on_the_same_seeds_and_pairs_are_antithetic(slope_pilot):
    store = RunStore(slope_pilot)
    plan = store.read_pilot_plan()
    specs = {m["index"]: MemberSpec.from_dict(json.loads((Path(m["work_dir"]) / "spec.json").read_text()))
             for m in plan["members"]}
    by_role: dict[tuple, MemberSpec] = {(m["role"], m["pair"], m["seed_index"]): specs[m["index"]]
                                        for m in plan["members"]}
    centre = by_role[("centre", None, 0)].params
    for (role, pair, s), spec in by_role.items():
        assert spec.seed == plan["seeds"][s] == by_role[("centre", None, s)].seed  # common random numbers
        if role != "centre":
            sign = 1.0 if role == "plus" else -1.0
            want = [c + sign * RADIUS * z for c, z in zip(centre, plan["directions"][pair])]
            assert spec.params == pytest.approx(want, abs=1e-15)
    assert len(set(plan["seeds"])) == 2


def test_the_recommendation_follows_from_the_snr_and_a_resume_retrains_nothing(slope_pilot, capsys):
    snr = _summary(slope_pilot)["combinations"][0]["snr"]
    per_pair = snr / (POPULATION / 2)  # SNR(P) = (P/2) per_pair with r = 1
    populations = {}
    for target in (1.0, 40.0, 160.0):
        assert main([f"run_dir={slope_pilot}", "new=true", f"pilot.target_snr={target}"]) == 0
        rec = _summary(slope_pilot)["recommendation"]
        population = rec["population"]
        assert population % 2 == 0 and population / 2 * per_pair >= target
        assert population == 2 or (population - 2) / 2 * per_pair < target  # the smallest even one
        assert rec["seeds_per_member"] == max(1, math.ceil(target / snr - 1e-9))
        assert rec["search_runs"] == population * 2  # generations=2, one seed per member
        populations[target] = population
    assert populations[1.0] == 2 and populations[160.0] > 3 * populations[40.0] > 0  # scales as target / SNR
    assert f"smallest even population at r=1: {populations[160.0]}" in capsys.readouterr().out
    assert all(calls == ["attempt 0"] for calls in _calls(slope_pilot))


def test_the_report_of_a_pilot_dir_shows_the_findings_of_pilot_json(slope_pilot, tmp_path, capsys, monkeypatch):
    assert is_pilot_dir(slope_pilot) and not is_pilot_dir(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["results.report", str(slope_pilot), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("results.report", run_name="__main__")
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(format_pilot(_summary(slope_pilot)))
    assert "SNR of one generation's ES step at P=4, r=1: (P/2) sigma_s^2 / (sigma_n^2/r) =" in text
    assert (tmp_path / "out" / "pilot.txt").read_text() == format_pilot(_summary(slope_pilot))


def test_export_writes_a_preset_that_meta_run_composes(slope_pilot, tmp_path):
    out = tmp_path / "presets" / "experiment" / "rec.yaml"
    assert main([f"run_dir={slope_pilot}", "new=true", "pilot.target_snr=40", f"pilot.export={out}"]) == 0
    rec = _summary(slope_pilot)["recommendation"]
    raw = compose(["experiment=rec", f"hydra.searchpath=[file://{tmp_path / 'presets'}]"])
    assert raw["population"] == rec["population"] and raw["es"]["radius"] == rec["radius"]
    assert raw["divergence"]["coef"] == rec["coef"] and raw["train"]["eval_every"] is None
    assert out.read_text().startswith("# @package _global_\n# Exported by python -m meta.pilot")
    assert main([f"run_dir={slope_pilot}", "new=true", f"pilot.export={out}"]) == 0  # the same file again: fine
    other = tmp_path / "mine.yaml"
    other.write_text("# @package _global_\npopulation: 8\n")
    assert main([f"run_dir={slope_pilot}", "new=true", f"pilot.export={other}"]) == 1  # never overwritten
    assert other.read_text() == "# @package _global_\npopulation: 8\n"


def test_without_a_slope_it_reports_no_signal_and_exports_nothing(tmp_path, capsys):
    run_dir = tmp_path / "flat"
    # A 5% test says "signal" for 1 in 20 flat objectives (seed 0 here: p = 0.043; seeds 1..5: 0.80, 0.08, 0.89, 0.62,
    # 0.36; and 4.5% of 2000 simulated flat pilots of this size): a fixed seed outside that 5%
    args = [f"run_dir={run_dir}", "new=true", *SYNTH, *PINNED, "+inner.options={slope: 0.0, param_noise: 0.05}", "pilot.seeds=3",
            "pilot.pairs=6", "seed=1"]
    assert main(args) == 0
    (combo,) = _summary(run_dir)["combinations"]
    assert not combo["signal"] and combo["snr"] is None and combo["p_value"] >= 0.05
    out = capsys.readouterr().out
    assert "no signal" in out and "none: no combination shows signal" in out
    assert main([f"run_dir={run_dir}", "new=true", f"pilot.export={tmp_path / 'x.yaml'}"]) == 1
    assert not (tmp_path / "x.yaml").exists()


def test_radii_and_coefs_are_scanned_as_combinations_on_shared_directions(tmp_path):
    run_dir = tmp_path / "scan"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "+inner.options={slope: 1.0}", "pilot.seeds=2", "pilot.pairs=1",
                 "pilot.radii=[0.005,0.02]", "pilot.coefs=[0.5,2.0]"]) == 0
    plan = RunStore(run_dir).read_pilot_plan()
    assert plan["combinations"] == [{"radius": 0.005, "coef": 0.5}, {"radius": 0.005, "coef": 2.0},
                                    {"radius": 0.02, "coef": 0.5}, {"radius": 0.02, "coef": 2.0}]
    assert len(plan["members"]) == 4 * 2 * (1 + 2 * 1)
    for m in plan["members"]:
        spec = json.loads((Path(m["work_dir"]) / "spec.json").read_text())
        combo = plan["combinations"][m["combination"]]
        assert spec["inner"]["divergence"]["coef"] == combo["coef"]
        if m["role"] == "plus":  # the same direction for every combination, scaled by its radius
            step = [p - c for p, c in zip(spec["params"], plan["centre"])]
            assert step == pytest.approx([combo["radius"] * z for z in plan["directions"][0]], abs=1e-12)
    summary = _summary(run_dir)
    # noise-free differences (no noise option): every combination has signal with sigma_n^2 = 0
    assert [c["noise_free"] for c in summary["combinations"]] == [True] * 4
    assert summary["recommendation"]["population"] == 2


def test_intermediate_scores_that_rank_like_the_final_ones_correlate_fully(tmp_path, capsys):
    run_dir = tmp_path / "early"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "+inner.options={slope: 10.0, param_noise: 0.05, intermediate_noise: 0}",
                 "train.eval_every=20", "pilot.seeds=2", "pilot.pairs=2"]) == 0
    inter = _summary(run_dir)["combinations"][0]["intermediate"]
    assert inter["measured"] and [s["step"] for s in inter["steps"]] == [20, 40]
    assert [s["rho"] for s in inter["steps"]] == [pytest.approx(1.0)] * 2 and inter["steps"][0]["n"] == 10
    out = capsys.readouterr().out
    assert "Spearman rho over 10 runs: step 20: 1.000" in out
    # what early_stop would cut (meta.early_cuts): per seed, the 4 perturbed inits; early ranks are the final ones
    cuts = out[out.index("early_stop at these settings"):]
    assert "0.333   20 | 0.000 [0.000, 0.602] of 4 | k=0: 4/8 stopped, 0.000" in cuts, cuts
    assert "snes 1.000 (1.000), cem 1.000 (1.000)" in cuts


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "dry"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "dry_run=true", "resources.gpus=1", "resources.member_time_min=30",
                 "pilot.radii=[0.005,0.01]", "pilot.coefs=[0.5,1.0]"]) == 0
    text = capsys.readouterr().out
    assert "4 combination(s) x (k + 2 m k) = 4 x (3 + 2 x 4 x 3) = 108" in text
    assert "GPU-hours: 108 runs x 0.50 h x 1 GPU = 54.00 GPU-h" in text
    assert "  3: radius 0.01, coef 1" in text and "not measured (train.eval_every is null)" in text
    assert not run_dir.exists()


@pytest.mark.parametrize("override, fragment", [
    ("pilot.seeds=1", "pilot.seeds=1"), ("pilot.pairs=0", "pilot.pairs=0"),
    ("pilot.radii=[0.01,-0.02]", "pilot.radii"), ("pilot.radii=[0]", "pilot.radii"),
    ("pilot.coefs=[-1]", "pilot.coefs"), ("+pilot.sedes=3", "pilot.sedes"), ("pilot.target_snr=0", "pilot.target_snr"),
    ("es=cmaes es.radius=0", "es.radius"), ("es.sigma_init=0.1", "es.sigma_init is now es.radius"),
    ("pilot.radii=[0.01,0.01]", "repeats"),
])
def test_bad_input_exits_2_before_anything_runs(tmp_path, capsys, override, fragment):
    run_dir = tmp_path / "bad"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, *override.split()]) == 2
    assert fragment in capsys.readouterr().err
    assert not run_dir.exists()


def test_every_searcher_takes_the_one_radius_key():
    for path in sorted((CONF_DIR / "es").glob("*.yaml")):  # es.radius, the one key, reaches every searcher
        raw = compose([f"es={path.stem}", "es.radius=0.03"])
        assert build_searcher(searcher_settings(raw["es"]), torch.zeros(4, dtype=torch.float64), 4, 0), path.name


def test_synthetic_slope_and_per_params_noise(tmp_path):
    def fitness(params, seed, **options):
        spec = MemberSpec(run_id="r", generation=0, index=0, seed=seed, params=params, work_dir=str(tmp_path),
                          inner={"options": options})
        return synthetic_member(spec)["fitness"]

    x, y = [0.02] * 380, [0.03] * 380
    assert fitness(x, 1, slope=2.0) == pytest.approx(0.5)  # at x = target: base
    from meta.synthetic import slope_direction

    assert fitness(y, 1, slope=2.0) == pytest.approx(0.5 + 2.0 * 0.01 * sum(slope_direction(380)))
    # the shared seed noise cancels in a difference; the per-params noise repeats for (seed, params) only
    assert fitness(x, 1, slope=2.0, param_noise=0.1) == fitness(x, 1, slope=2.0, param_noise=0.1)
    diff_same_seed = fitness(x, 1, slope=0.0, noise=0.3, param_noise=0.1) - fitness(y, 1, slope=0.0, noise=0.3,
                                                                                   param_noise=0.1)
    diff_no_params = fitness(x, 1, slope=0.0, noise=0.3) - fitness(y, 1, slope=0.0, noise=0.3)
    assert diff_no_params == 0.0 and diff_same_seed != 0.0
    assert fitness(x, 2, slope=0.0, param_noise=0.1) != fitness(x, 1, slope=0.0, param_noise=0.1)


def _start(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meta.pilot", f"run_dir={run_dir}", "new=true", *extra], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_kill_and_resume_finishes_without_retraining_finished_runs(tmp_path):
    options = "slope: 10.0, param_noise: 0.05, count_calls: true"
    args = ["inner.entrypoint=meta.synthetic:member", *PINNED, "pilot.seeds=2", "pilot.pairs=1"]
    reference = tmp_path / "reference"  # the same runs uninterrupted (sleeping changes no fitness)
    assert main([f"run_dir={reference}", "new=true", "launcher=debug", *args, f"+inner.options={{{options}}}"]) == 0
    args.append(f"+inner.options={{{options}, sleep_s: 0.5}}")

    run_dir = tmp_path / "killed"
    store = RunStore(run_dir)
    proc = _start(run_dir, ["launcher=local", *args])
    wait_for_file(store.pilot_runs_dir / "jobs.json", proc)
    assert proc.poll() is None, "the pilot finished before it could be killed; the test did not test anything"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (store.read_pilot() or {}).get("complete")  # killed before its end: the findings so far at most
    final = _start(run_dir, ["launcher=local", *args])
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err.decode()[-3000:]
    assert all(calls == ["attempt 0"] for calls in _calls(run_dir)), "a finished or running run was trained again"
    got, want = _summary(run_dir)["combinations"], _summary(reference)["combinations"]
    for key in ("noise_var", "signal_var", "f", "pairs", "centre"):
        assert [c[key] for c in got] == [c[key] for c in want], key


def test_the_report_of_an_unfinished_pilot_shows_the_runs_final_so_far(tmp_path, capsys):
    from meta.pilot.findings import summarize_run_dir
    from results.report.pilot import main as report_main

    run_dir = tmp_path / "pilot"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "+inner.options={slope: 10.0, param_noise: 0.05}", "pilot.seeds=2",
                 "pilot.pairs=2"]) == 0
    store = RunStore(run_dir)
    for member in store.read_pilot_plan()["members"][3:5]:  # as if killed before the end, two runs not final
        (Path(member["work_dir"]) / "result.json").unlink()
    store.write_pilot(summarize_run_dir(run_dir))  # what meta.pilot wrote when the eighth became final
    capsys.readouterr()
    assert report_main([str(run_dir), "--out", str(tmp_path / "report")]) == 0
    text = capsys.readouterr().out
    assert "8/10 runs final, 0 failed; PARTIAL" in text and "fail" in text.split("pair 0:")[1].splitlines()[0]
    assert report_main([str(tmp_path / "nothing")]) == 2


def test_help_prints_the_usage(capsys):
    from meta.pilot.cli import USAGE

    assert main(["--help"]) == 0
    assert capsys.readouterr().out == USAGE + "\n"


# Scale apart from direction: f = base + slope w.(x - target) + RADIAL rms(x - target) + noise. The radial term gains
# with a map's distance from target whatever the direction (c + e and c - e alike, to ~1e-3 here): a scale effect of
# RADIAL (mean over members of rms(x - t) - rms(c - t)), known from the plan's own maps; slope adds a direction.
RADIAL, SCALE_RADIUS = 2.0, 0.1
SCALE_ARGS = [*SYNTH, "es=pgpe", f"es.radius={SCALE_RADIUS}", "init=uniform", "pilot.seeds=3", "pilot.pairs=4",
              "seed=2"]


def _known_scale(run_dir: Path) -> float:
    plan = RunStore(run_dir).read_pilot_plan()

    def rms(x):
        return math.sqrt(sum((v - 0.02) ** 2 for v in x) / len(x))

    centre = plan["centre"]
    maps = [[c + sign * SCALE_RADIUS * z for c, z in zip(centre, d)] for d in plan["directions"] for sign in (1, -1)]
    return RADIAL * (statistics.fmean(rms(m) for m in maps) - rms(centre))


@pytest.mark.parametrize("slope,buys", [(0.0, "scale"), (1.0, "both")])
def test_the_pilot_reports_the_scale_effect_apart_from_the_direction(tmp_path, capsys, slope, buys):
    run_dir = tmp_path / "scale"
    options = f"+inner.options={{slope: {slope}, radial: {RADIAL}, param_noise: 0.02, noise: 0.05}}"
    assert main([f"run_dir={run_dir}", "new=true", *SCALE_ARGS, options]) == 0
    (combo,) = _summary(run_dir)["combinations"]
    scale, known = combo["scale"], _known_scale(run_dir)
    assert known > 0.1 and scale["n"] == 3 and scale["low"] < known < scale["high"] and scale["low"] > 0
    assert combo["signal"] is (slope > 0) and combo["buys"] == buys
    out = capsys.readouterr().out
    assert f"  scale: the maps at the radius minus the centre, per seed: {scale['mean']:+.4f} [" in out
    assert f"a search buys {buys}: a search at radius {SCALE_RADIUS:g} would buy" in out
    if buys == "scale":
        assert "Tune the coefficient instead" in out and "radius_random" in out
        assert "The maps gain by their scale alone at radius 0.1: tune the coefficient there instead" in out
    else:
        assert "Search at this radius" in out
