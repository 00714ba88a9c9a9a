"""A run_dir that does not exist is a new run only when the command says so (new=true): a mistyped resume path is
refused naming the closest existing run directories, instead of starting a new search; a new run is labelled as one
in the plan and the log (meta.run, meta.pilot, meta.tune)."""
from __future__ import annotations

import logging

import pytest

from meta.pilot.cli import main as pilot_main
from meta.search.resume import nearest_run_dirs
from meta.search.run import main as run_main
from meta.tune.cli import main as tune_main

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=2", "generations=1",
         "reevaluate.top_k=0"]


def _a_run(path):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("seed: 0\n")  # what makes a folder a run (RunStore.exists)
    return path


@pytest.mark.parametrize("main", [run_main, pilot_main, tune_main])
def test_a_missing_run_dir_is_refused_naming_the_closest_runs(tmp_path, capsys, main):
    runs = tmp_path / "outputs"
    near = _a_run(runs / "meta_2026-11-20_10-00-00")
    _a_run(runs / "unrelated")
    typo = runs / "meta_2026-11-20_10-00-01"
    assert main([f"run_dir={typo}", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir={typo} holds no run to resume" in err and str(near) in err and "new=true" in err
    assert "unrelated" not in err and not typo.exists()


def test_a_folder_holding_something_else_is_refused_too(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert run_main([f"run_dir={tmp_path}", "dry_run=true"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err


def test_new_true_plans_a_new_search_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "fresh"
    assert run_main([f"run_dir={run_dir}", "new=true", "dry_run=true", *SYNTH]) == 0
    assert f"new search in {run_dir}" in capsys.readouterr().out.splitlines()[0]
    assert not run_dir.exists()


@pytest.mark.parametrize(("main", "label", "entry"), [(pilot_main, "new pilot in", "meta.synthetic:member"),
                                                       (tune_main, "new tuning run in", "meta.tune.synthetic:run")])
def test_new_true_plans_a_new_pilot_or_tuning(tmp_path, capsys, main, label, entry):
    run_dir = tmp_path / "fresh"
    assert main([f"run_dir={run_dir}", "new=true", "dry_run=true", "launcher=debug", f"inner.entrypoint={entry}"]) == 0
    assert f"{label} {run_dir}" in capsys.readouterr().out


def test_a_new_search_is_logged_as_one_and_the_same_command_again_resumes_it(tmp_path, caplog, capsys):
    run_dir = tmp_path / "search"
    with caplog.at_level(logging.INFO, logger="meta.run"):
        assert run_main([f"run_dir={run_dir}", "new=true", *SYNTH]) == 0
        assert f"new search in {run_dir}" in caplog.text
        caplog.clear()
        assert run_main([f"run_dir={run_dir}", "new=true", *SYNTH]) == 0  # a requeued job's same command line
        assert f"resume of the search in {run_dir}" in caplog.text
    manifest = (run_dir / "manifest.json").read_text()
    assert "new=true" not in manifest and "new:" not in (run_dir / "config.yaml").read_text()


def test_an_empty_folder_made_for_the_run_is_a_new_run(tmp_path, capsys):
    assert run_main([f"run_dir={tmp_path}", "dry_run=true", *SYNTH]) == 0
    assert f"new search in {tmp_path}" in capsys.readouterr().out


def test_nearest_run_dirs_looks_from_the_nearest_existing_parent(tmp_path):
    run = _a_run(tmp_path / "outputs" / "meta_a")
    assert nearest_run_dirs(tmp_path / "outputs" / "meta_b") == [str(run)]
    assert nearest_run_dirs(tmp_path / "outputz" / "meta_a") == [str(run)]  # a typo in the folder above
    assert nearest_run_dirs(tmp_path / "outputs" / "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz") == []
