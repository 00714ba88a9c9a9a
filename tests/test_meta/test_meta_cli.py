"""The meta.* commands share one entry-point contract (meta/cli_args.run_command): --help prints the usage and
exits 0, bad input is one line on stderr naming the problem and exits 2 before anything is written."""
from __future__ import annotations

import importlib

import pytest

COMMANDS = {
    "meta.run": ("population=0", "config error: population=0"),
    "meta.tune.cli": ("tune.trials=0", "config error: tune.trials=0"),
    "meta.search.after.export": ("nope=1", "export error: argument 'nope=1'"),
    "meta.search.after.reevaluate": ("nope=1", "reevaluate error: argument 'nope=1'"),
    "meta.pilot.cli": ("pilot.seeds=1", "config error: pilot.seeds=1"),
}


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_prints_the_usage_and_exits_0(module, capsys):
    command = importlib.import_module(module)
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out == command.USAGE + "\n"
    assert out.startswith("usage: python -m meta.")


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_bad_input_exits_2_naming_it_before_anything_is_written(module, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad, message = COMMANDS[module]
    assert importlib.import_module(module).main([bad]) == 2
    assert capsys.readouterr().err.startswith(message)
    assert list(tmp_path.iterdir()) == []
