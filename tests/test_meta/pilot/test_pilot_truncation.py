"""meta.pilot's truncation check for es=nres (issue 59, deliverable 7): per phase of a particle's run the pairs'
differences of their change of validation pass@1, the SNR per update and per episode, and the population, truncation
length and step that follow, or why nres cannot see anything.

The statistics are checked on phase differences drawn with a known signal and noise per phase; the pilot end to end
on the synthetic member, whose ``intermediate_noise`` scores (the final fitness blurred, every train.eval_every steps)
put the whole signal into the first phase and noise alone into the others."""
from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
import yaml

from meta.compose import compose
from meta.pilot.cli import main
from meta.pilot.status import render_pilot
from meta.pilot.truncation import STEP_KEY, TRUNCATION_KEY, TruncationSettings, phase_differences, truncation_check
from results.report.pilot import build_pilot_report
from results.store.run_store import RunStore

#: per phase: the spread of the pairs' seed-free differences and of one seed's noise (the last phase: no signal)
SIGNAL_SD, NOISE_SD = (0.04, 0.03, 0.05, 0.0), 0.01
PAIRS, SEEDS, T = 300, 2, 25
HORIZON = T * len(SIGNAL_SD)


def _draw(signal_sd: tuple[float, ...], seed: int = 0) -> list[list[list[float]]]:
    """d_isk = a_ik + n_isk: pair i's signal in phase k, a ~ N(0, signal_sd[k]^2), the same on every seed; noise
    n ~ N(0, NOISE_SD^2) per seed."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(PAIRS):
        signal = [rng.gauss(0.0, sd) for sd in signal_sd]
        diffs.append([[a + rng.gauss(0.0, NOISE_SD) for a in signal] for _ in range(SEEDS)])
    return diffs


def _settings(**changes) -> TruncationSettings:
    base = dict(truncation_steps=T, horizon=HORIZON, population=10, generations=40, target_snr=20.0, stagger=False,
                step=0.5, per_truncation=True, budget_steps=10 * 40 * T)
    return TruncationSettings(**{**base, **changes})


def test_phase_statistics_and_the_recommendation_on_a_known_signal_and_noise():
    check = truncation_check(_draw(SIGNAL_SD), 200, _settings())
    phases, episode = check["phases"], check["episode"]
    assert [(p["start"], p["stop"]) for p in phases] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    for row, sd in zip(phases, SIGNAL_SD):  # 300 pairs x 2 seeds: each variance within ~20%
        assert row["n"] == PAIRS * SEEDS and abs(row["mean"]) < 4 * math.sqrt((sd**2 + NOISE_SD**2) / PAIRS)
        assert row["sd"] ** 2 == pytest.approx(sd**2 + NOISE_SD**2, rel=0.2)
        assert row["noise_var"] == pytest.approx(NOISE_SD**2, rel=0.2)
        assert row["signal_var"] == pytest.approx(sd**2, rel=0.2, abs=2e-5)
        assert row["signal"] is (sd > 0)  # the F-test: the last phase carries none
        assert row["snr_estimate"] == pytest.approx(10 / 2 * row["signal_var"] / row["noise_var"])
    # the episode: the sum over the phases, independent signals and noises adding up
    assert episode["signal_var"] == pytest.approx(sum(sd**2 for sd in SIGNAL_SD), rel=0.2)
    assert episode["noise_var"] == pytest.approx(len(SIGNAL_SD) * NOISE_SD**2, rel=0.2)
    per_update = 10 / 2 * sum(p["signal_var"] / p["noise_var"] for p in phases) / len(phases)
    assert check["update_snr"] == pytest.approx(per_update)
    assert per_update == pytest.approx(10 / 2 * sum(sd**2 for sd in SIGNAL_SD) / NOISE_SD**2 / 4, rel=0.2)

    rec = check["recommendation"]  # u = 0.005 / 0.0004 = 12.5 per pair: P* = 2 ceil(20 / 12.5) = 4
    u = episode["signal_var"] / episode["noise_var"]
    assert rec["visible"] and rec["population"] == 2 * math.ceil(20 / u) == 4
    assert rec["truncation_steps"] == T  # every phase resolved at 1/V = 0.005
    s = rec["step_snr"]  # every truncation moves the centre: the mean per-update SNR at P* = 4
    assert s == pytest.approx(4 / 2 * sum(p["signal_var"] / p["noise_var"] for p in phases) / 4)
    assert rec["step_factor"] == pytest.approx(s / (1 + s)) and rec["step"] == pytest.approx(0.5 * s / (1 + s))
    assert rec["budget_particles"] == 10 * 40 * T / HORIZON
    # stagger: every update mixes the phases, their pooled signal over their pooled noise
    mixed = truncation_check(_draw(SIGNAL_SD), 200, _settings(stagger=True))
    pooled = sum(p["signal_var"] for p in phases) / sum(p["noise_var"] for p in phases)
    assert mixed["update_snr"] == pytest.approx(10 / 2 * pooled)
    # a run's changes summed before the update reads them: its step reads the episode's SNR, T stays as measured
    run = truncation_check(_draw(SIGNAL_SD), 50, _settings(per_truncation=False))["recommendation"]
    assert run["visible"] and run["step_snr"] == pytest.approx(4 / 2 * u)
    assert (run["truncation_steps"], run["resolved_steps"]) == (T, 2 * T)  # 1/V = 0.02: see the next test


def test_truncations_are_lengthened_until_every_phase_resolves_one_problem():
    # 1/V = 0.02: the last phase (noise alone, median |d| ~ 0.0067) does not resolve; merged with the third it does
    check = truncation_check(_draw(SIGNAL_SD), 50, _settings())
    assert [p["resolved"] for p in check["phases"]] == [True, True, True, False]
    rec = check["recommendation"]
    assert rec["visible"] and rec["truncation_steps"] == 2 * T


@pytest.mark.parametrize("case", ["no signal", "budget", "resolution"])
def test_it_says_plainly_when_nres_cannot_see_anything(case):
    signal = (0.0,) * 4 if case == "no signal" else SIGNAL_SD
    settings = _settings(budget_steps=HORIZON) if case == "budget" else _settings()  # one particle run in all
    val_size = 2 if case == "resolution" else 200  # 1/V = 0.5: pass@1 on two problems moves by halves
    rec = truncation_check(_draw(signal, seed=1), val_size, settings)["recommendation"]
    assert not rec["visible"]
    if case == "no signal":
        assert rec["reason"].startswith("no signal in whole particle runs") and rec["population"] is None
    elif case == "budget":
        assert rec["reason"].startswith("nres cannot see anything at this budget") and rec["budget_particles"] == 1
    else:
        assert rec["reason"].startswith("nres's truncations cannot see anything") and rec["truncation_steps"] == HORIZON


def test_phase_differences_telescope_to_the_final_difference():
    plus, minus = {25: 0.50, 50: 0.60, 75: 0.62}, {25: 0.40, 50: 0.55, 75: 0.70}
    d = phase_differences(plus, minus, [25, 50, 75])
    assert d == pytest.approx([0.10, -0.05, -0.13]) and sum(d) == pytest.approx(0.62 - 0.70)
    assert phase_differences(plus, {25: 0.4}, [25, 50, 75]) is None  # a boundary not scored: the pair-seed unusable


def test_the_step_key_is_a_setting_of_es_nres():
    assert STEP_KEY in compose(["es=nres"])["es"]  # conf/es/nres.yaml renamed it: follow in meta/pilot/truncation.py


def test_an_nres_pilot_validates_every_truncation_and_prints_the_phase_table(tmp_path, capsys):
    run_dir = tmp_path / "nres"
    args = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "es=nres", f"es.{TRUNCATION_KEY}=20",
            "+inner.options={slope: 10.0, param_noise: 0.02, noise: 0.1, intermediate_noise: 0.03, val_size: 200}",
            "pilot.seeds=2", "pilot.pairs=3", "population=4", "generations=30"]
    assert main([f"run_dir={run_dir}", "new=true", *args, "dry_run=true"]) == 0
    assert "2 per run x 14 runs = 28 extra validations" in capsys.readouterr().out  # steps 20 and 40 of 60
    assert main([f"run_dir={run_dir}", "new=true", *args]) == 0
    store = RunStore(run_dir)
    plan = store.read_pilot_plan()
    assert plan["truncation"] == {"steps": 20, "horizon": 60, "eval_subset": 200}  # train.val_size
    spec = yaml.safe_load((Path(plan["members"][0]["work_dir"]) / "spec.json").read_text())
    assert (spec["inner"]["train"]["eval_every"], spec["inner"]["train"]["eval_subset"]) == (20, 200)
    (combo,) = store.read_pilot()["combinations"]
    check = combo["truncation"]
    # the phases' differences add up to the final ones; the slope's signal is all in the first phase
    assert check["episode"]["mean"] == pytest.approx(sum(p["mean"] for p in combo["pairs"]) / 3)
    assert check["episode"]["signal_var"] == pytest.approx(combo["signal_var"])
    first, *rest = check["phases"]
    assert first["signal"] and first["signal_var"] > 100 * max(p["signal_var"] for p in rest)
    rec = check["recommendation"]
    assert rec["visible"] and rec["population"] == 2 and rec["truncation_steps"] == 20
    out = capsys.readouterr().out
    assert "truncation check (es=nres, T=20 of train.steps=60, 3 phases)" in out
    assert "      0      [0, 20)    6 " in out and "episode      [0, 60)    6 " in out
    assert f"es=nres: population 2 (an episode at the target SNR 1), es.{TRUNCATION_KEY}=20, es.{STEP_KEY}=" in out
    assert "runs, each validated every 20 of its 60 steps (the truncation check)\n" in render_pilot(run_dir)
    text, files = build_pilot_report(run_dir, tmp_path / "report")  # python -m results.report's text and table
    assert "truncation check (es=nres" in text
    (row,) = csv.DictReader(files[1].read_text().splitlines())
    assert (row["nres_population"], row["nres_truncation_steps"]) == ("2", "20")
    preset = tmp_path / "nres.yaml"
    assert main([f"run_dir={run_dir}", "new=true", f"pilot.export={preset}"]) == 0
    es = yaml.safe_load(preset.read_text())["es"]
    assert es[TRUNCATION_KEY] == 20 and es[STEP_KEY] == pytest.approx(rec["step"])


def test_another_intermediate_validation_with_es_nres_exits_2_naming_the_key(tmp_path, capsys):
    run_dir = tmp_path / "bad"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                 "es=nres", f"es.{TRUNCATION_KEY}=20", "train.eval_every=7"]) == 2
    assert "train.eval_every=7: with es=nres the pilot validates its runs every es.truncation_steps=20" in \
        capsys.readouterr().err
    assert not run_dir.exists()
