"""A typo on the command line is refused before anything is written, with or without '+', naming the closest known
keys; a misspelled group option lists the group's choices (every Hydra command: meta.run, meta.tune, meta.pilot,
inner_loop.run)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meta.pilot.cli import main as pilot_main
from meta.search.run import main as run_main
from meta.tune.cli import main as tune_main
from core.config.plain_data import closest_keys, refuse_unknown_keys

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("main", "typo", "meant"), [
    (run_main, "+populaton=8", "population"),
    (run_main, "populaton=8", "population"),
    (run_main, "+generation=5", "generations"),
    (run_main, "+pilot.seed=3", "pilot.seeds"),
    (tune_main, "+trials=40", "tune.trials"),
    (tune_main, "tune.trails=40", "tune.trials"),
    (pilot_main, "+seeds=3", "pilot.seeds"),
])
def test_an_unknown_key_is_refused_with_the_closest_known_ones(tmp_path, capsys, main, typo, meant):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "dry_run=true", typo]) == 2
    err = capsys.readouterr().err
    assert typo.lstrip("+").split("=")[0] in err and f"did you mean {meant}" in err
    assert not run_dir.exists()


@pytest.mark.parametrize("main", [run_main, tune_main, pilot_main])
def test_a_misspelled_group_option_lists_the_choices(tmp_path, capsys, main):
    assert main([f"run_dir={tmp_path / 'run'}", "new=true", "dry_run=true", "divergence=kll"]) == 2
    err = capsys.readouterr().err
    assert "did you mean divergence=kl?" in err and "kl, neural_mirror, none, prob_l2" in err


def test_es_choice_typo_names_pgpe(tmp_path, capsys):
    assert run_main([f"run_dir={tmp_path / 'run'}", "new=true", "dry_run=true", "es=pgep"]) == 2
    assert "cem, cmaes, nres, openai_es_elite, pgpe, snes" in capsys.readouterr().err


def test_a_plus_on_a_known_key_sets_it_and_free_form_nodes_take_new_fields(tmp_path, capsys):
    assert run_main([f"run_dir={tmp_path / 'run'}", "new=true", "dry_run=true", "+population=6",
                     "inner.entrypoint=meta.synthetic:member", "+train.trl.log_completions=false",
                     "inner.options={}"]) == 0
    assert "population 6" in capsys.readouterr().out


def test_closest_keys_match_the_whole_path_or_its_last_part():
    assert closest_keys("populaton", ["population", "seed", "tune.trials"]) == ["population"]
    assert closest_keys("trials", ["population", "tune.trials"]) == ["tune.trials"]
    assert closest_keys("zzz", ["population"]) == []
    with pytest.raises(ValueError, match=r"did you mean pilot\.seeds"):
        refuse_unknown_keys({"seed": 1}, ["seeds", "pairs"], "pilot")


def test_inner_loop_run_refuses_an_unknown_key_with_status_2():
    done = subprocess.run([sys.executable, "-m", "inner_loop.run", "+seeed=1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "did you mean seed" in done.stderr and "Traceback" not in done.stderr


def test_inner_loop_run_checks_groups_and_keeps_hydra_flags():
    from inner_loop.run import checked_command_line

    with pytest.raises(ValueError, match="the choices are kl, neural_mirror, none, prob_l2"):
        checked_command_line(["divergence=kl,prob_ll"])
    assert checked_command_line(["-m", "+seed=2", "task=mbpp", "+task.sandbox.require_isolation=true"]) == [
        "-m", "++seed=2", "task=mbpp", "+task.sandbox.require_isolation=true"]


def test_a_coefficient_per_divergence_takes_divergence_names_only():
    from meta.compose import compose
    from meta.search.config import ConfigError

    assert compose(["+coef_by_divergence.kl=0.2"])["coef_by_divergence"]["kl"] == 0.2
    with pytest.raises(ConfigError, match=r"options of the config group 'divergence' as keys \(kl, neural_mirror"):
        compose(["+coef_by_divergence.kll=0.2"])
