"""Modules that moved to the ground floor (core/) keep their old paths: a search started before the move has queued
jobs and finished results pickled under those names, and must resume and read them after it."""
from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

from core.records import ResultRecord
from results.store import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_imports_the_moved_module_itself(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert importlib.import_module(new).__spec__.name == new  # the module's own spec, not the alias's


def test_a_result_pickled_under_the_old_path_loads_in_a_fresh_process():
    """What a job finished before the move returns (submitit pickles it) unpickles to today's class."""
    record = ResultRecord(status="ok", fitness=0.25, steps_done=3)
    old = pickle.dumps(record, protocol=0).replace(b"ccore.records\n", b"cresults.store.records\n")
    assert b"results.store.records" in old
    code = ("import pickle, sys; r = pickle.loads(sys.stdin.buffer.read()); "
            "print(type(r).__module__, r.steps_done, r.fitness, r.status)")
    done = subprocess.run([sys.executable, "-c", code], input=old, capture_output=True, check=True)
    assert done.stdout.decode().split() == ["core.records", "3", "0.25", "ok"]


def test_an_unknown_old_name_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("results.store.no_such_module")
