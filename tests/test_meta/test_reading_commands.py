"""The commands that read a run directory (meta.status, meta.export, results.report, results.compare) take it the same
way (the bare path or run_dir=), refuse a user's mistake in a sentence instead of a traceback, and say what is true
of a finished search."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from meta.search.after.export import main as export_main
from meta.search.run import main as run_main
from meta.status.view import finished, main as status_main
from results.report.compare import main as compare_main
from results.report.search.report import main as report_main


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished search with its selection and result table (synthetic members, seconds)."""
    run_dir = tmp_path_factory.mktemp("reading") / "search"
    assert run_main([f"run_dir={run_dir}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                     "population=2", "generations=1", "reevaluate.top_k=1", "reevaluate.seeds=2",
                     "reevaluate.report_seeds=2"]) == 0
    return run_dir


@pytest.mark.parametrize("form", ["bare", "key"])
def test_every_reading_command_takes_the_bare_path_and_run_dir(search, tmp_path, capsys, form):
    arg = str(search) if form == "bare" else f"run_dir={search}"
    assert status_main([arg]) == 0
    assert export_main([arg, f"out={tmp_path / 'init.safetensors'}"]) == 0
    assert report_main([arg, "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "init.safetensors").is_file() and (tmp_path / "report" / "fitness.png").is_file()
    capsys.readouterr()
    assert compare_main([arg if form == "bare" else f"run_dir={search / 'gen_0000'}"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_compare_says_why_a_search_or_its_members_are_not_single_runs(search, capsys):
    assert compare_main([str(search / "gen_0000")]) == 2
    err = capsys.readouterr().err
    assert f"{search / 'gen_0000' / 'member_000'}: an ES population member, not a single run" in err
    assert compare_main([str(search)]) == 2
    assert "an ES search run dir (use python -m results.report on it)" in capsys.readouterr().err


def test_a_file_given_as_an_output_folder_is_refused(search, tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    assert report_main([str(search), "--out", str(existing)]) == 2
    assert compare_main([str(search / "gen_0000"), "--out", str(existing)]) == 2
    assert "is an existing file, not a folder" in capsys.readouterr().err
    assert existing.read_text() == "mine\n"


@pytest.mark.parametrize(("out", "says"), [(".", "is a directory; name the file to write"),
                                           ("y.pt", "name it out=")])
def test_export_refuses_an_out_that_is_a_folder_or_names_another_format(search, tmp_path, capsys, out, says):
    assert export_main([str(search), f"out={tmp_path / out}"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "y.pt").exists()


def test_an_init_that_is_a_folder_is_named_as_one(tmp_path, capsys):
    assert run_main([f"run_dir={tmp_path / 'r'}", "new=true", "dry_run=true", f"init={tmp_path}",
                     "inner.entrypoint=meta.synthetic:member"]) == 2
    assert "is a directory; name an init file in it" in capsys.readouterr().err


def test_the_report_lists_the_result_tables_files(search, tmp_path, capsys):
    assert report_main([str(search), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    listed = out.split("the result table's files")[1]
    for name in ("result_table.json", "result_table.md", "result_table.csv", "result_table.png"):
        assert str(search / "reevaluation" / "reporting" / name) in listed


def test_status_of_a_finished_search_says_so_and_watch_ends(search, capsys, monkeypatch):
    def no_more_frames(seconds: float) -> None:
        raise AssertionError("--watch went on after the search had finished")

    assert finished(search)
    monkeypatch.setattr(time, "sleep", no_more_frames)
    assert status_main([str(search), "--watch", "1"]) == 0
    out = capsys.readouterr().out
    assert "search finished: 1 generation(s) done" in out and "selection: done" in out
    assert "result table: done" in out and "search ETA" not in out
    member_lines = [line for line in out.splitlines() if line.strip().startswith("member ")]
    assert member_lines and not any("running" in line for line in member_lines)


def test_status_of_an_unfinished_search_is_not_finished(search, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(search, copy)
    with contextlib.suppress(FileNotFoundError):
        (copy / "reevaluation" / "reporting" / "result_table.json").unlink()
    assert not finished(copy)


def test_the_plan_of_a_finished_search_counts_nothing_left(search, capsys):
    """A resume's plan counts what is left: no generation range running backwards, no selection or reporting runs
    that exist already."""
    assert run_main([f"run_dir={search}", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "generations: all 1 done (0 to run)" in out and "..0" not in out
    assert "+ 0 selection runs" in out and "+ 0 reporting runs (below) = 0 left to run" in out
    assert "selection done (4 runs); result table done (16 runs)" in out
    assert "GPU-hours, what is left of the search: 0 runs" in out


def test_the_plan_of_a_partly_reevaluated_search_does_not_count_final_runs_again(search, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(search, copy)
    (copy / "reevaluation" / "reevaluation.json").unlink()
    (copy / "reevaluation" / "reporting" / "result_table.json").unlink()
    shutil.rmtree(copy / "reevaluation" / "reporting" / "member_000")
    assert run_main([f"run_dir={copy}", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "+ 0 selection runs" in out and "+ 1 reporting runs (below) = 1 left to run" in out
    assert "4 selection runs final; 15 reporting runs final" in out
