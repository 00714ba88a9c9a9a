"""meta.pilot's horizon check (issue 52, item 2): with es.member_steps below train.steps the pilot trains the first
combination's maps at both horizons on the same seeds and says whether T-step members rank maps as full runs do.

The synthetic objective's ``short_steps``/``short_slope`` make the horizons agree (the same slope) or disagree (the
opposite slope: the short run ranks maps in reverse, a short-horizon bias by construction)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meta.pilot.cli import main
from meta.pilot.horizon import AGREE_RHO, horizon_check, maps_to_settle
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "es=pgpe", "init=uniform", "pilot.seeds=2",
         "pilot.pairs=4"]
COST = {"runs": 0, "cost_hours": 0.0, "cost_unit": "CPU-h", "cost_text": "none"}


def _pilot(run_dir: Path, short_slope: float) -> dict:
    options = f"+inner.options={{slope: 10.0, short_steps: 20, short_slope: {short_slope}, param_noise: 0.01}}"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, options, "es.member_steps=20"]) == 0
    summary = RunStore(run_dir).read_pilot()
    assert summary is not None and summary["complete"] and summary["runs"] == 2 * 18
    return summary


def test_horizons_that_agree_give_the_verdict_agree_and_recommend_the_short_members(tmp_path, capsys):
    check = _pilot(tmp_path / "agree", 10.0)["horizon"]
    assert check["verdict"] == "agree" and check["maps"] == 9 and check["seeds"] == 2
    assert check["rho"] == pytest.approx(1.0) and check["low"] >= AGREE_RHO
    assert check["advice"] == "take es.member_steps=20"
    out = capsys.readouterr().out
    assert "horizon check (es.member_steps=20 against train.steps=60" in out
    assert "20-step members rank maps as 60-step runs do: Spearman rho +1.00" in out
    assert "cost: 18 runs at train.steps=60" in out


def test_horizons_that_disagree_give_the_verdict_disagree_and_recommend_nres(tmp_path, capsys):
    check = _pilot(tmp_path / "disagree", -10.0)["horizon"]
    assert check["verdict"] == "disagree" and check["rho"] == pytest.approx(-1.0) and check["high"] < AGREE_RHO
    assert "es=nres" in check["advice"] and "short-horizon bias" in check["sentence"]
    assert "do not search with es.member_steps=20" in capsys.readouterr().out


def test_the_pilots_runs_train_member_steps_and_the_checks_twins_train_steps_on_the_same_seeds(tmp_path):
    _pilot(tmp_path / "p", 10.0)
    plan = RunStore(tmp_path / "p").read_pilot_plan()
    spec = {m["index"]: json.loads((Path(m["work_dir"]) / "spec.json").read_text()) for m in plan["members"]}
    twins = [m for m in plan["members"] if m.get("horizon")]
    assert len(twins) == 18 and plan["horizon"] == {"member_steps": 20, "steps": 60}
    for twin in twins:
        short = next(m for m in plan["members"] if not m.get("horizon") and
                     (m["role"], m["pair"], m["seed_index"]) == (twin["role"], twin["pair"], twin["seed_index"]))
        assert spec[short["index"]]["inner"]["train"]["steps"] == 20
        assert spec[twin["index"]]["inner"]["train"]["steps"] == 60
        assert (spec[short["index"]]["seed"], spec[short["index"]]["params"]) == \
            (spec[twin["index"]]["seed"], spec[twin["index"]]["params"])


def test_without_member_steps_there_is_no_check_and_the_dry_run_says_what_one_costs(tmp_path, capsys):
    assert main([f"run_dir={tmp_path / 'none'}", "new=true", *SYNTH, "+inner.options={slope: 10.0}"]) == 0
    summary = RunStore(tmp_path / "none").read_pilot()
    assert summary["horizon"] is None and summary["runs"] == 18
    capsys.readouterr()
    assert main([f"run_dir={tmp_path / 'dry'}", "new=true", *SYNTH, "dry_run=true", "resources.gpus=1",
                 "resources.member_time_min=30", "es.member_steps=20"]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours: 18 runs x 0.17 h x 1 GPU = 3.00 GPU-h" in out  # the pilot's runs at 20 of 60 steps
    assert ("horizon check: the first combination's 9 maps x 2 seeds again at train.steps=60 (the runs above train "
            "es.member_steps=20): 18 runs x 0.50 h x 1 GPU = 9.00 GPU-h") in out
    assert not (tmp_path / "dry").exists()


def test_a_weak_correlation_is_not_settled_and_says_how_many_maps_and_seeds_would_settle_it():
    short = [[0.1, 0.12], [0.3, 0.26], [0.2, 0.25], [0.5, 0.4], [0.35, 0.45]]
    full = [[0.2, 0.22], [0.1, 0.14], [0.3, 0.33], [0.45, 0.5], [0.4, 0.36]]
    check = horizon_check(short, full, 10, 100, 0, COST)
    assert check["verdict"] == "not settled" and check["low"] < AGREE_RHO <= check["high"]
    assert check["maps_needed"] == maps_to_settle(check["rho"]) > check["maps"]
    assert check["seeds_needed"] is not None and "would settle it" in check["sentence"]
    assert "es=nres" in check["advice"]
    # Fisher z with the Spearman factor 1.06: rho 0.8 against 0.5 needs 3 + 1.06 (1.96 / (atanh 0.8 - atanh 0.5))^2
    assert maps_to_settle(0.8) == 17 and maps_to_settle(AGREE_RHO) is None
    assert horizon_check(short[:3], full[:3], 10, 100, 0, COST)["verdict"] == "not measured"
