"""The one recipe runner (meta/search/recipe.py): meta.run, meta.pilot and meta.tune start through it, and what it
does once it does the same for all three."""
from __future__ import annotations

import logging

import pytest

from meta.pilot.cli import main as pilot_main
from meta.search import recipe
from meta.search.lock import LOCKED_EXIT, RunLock
from meta.search.run import main as run_main
from meta.tune.cli import main as tune_main
from results.store.run_store import RunStore

PROGRAMS = {
    "meta.run": (run_main, ["launcher=debug", "inner.entrypoint=meta.synthetic:member"]),
    "meta.pilot": (pilot_main, ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "pilot.seeds=2",
                                "pilot.pairs=1"]),
    "meta.tune": (tune_main, ["launcher=debug", "inner.entrypoint=meta.tune.synthetic:run", "tune.sampler=random",
                              "tune.pruner=none"]),
}


def test_each_program_is_a_recipe_its_main_hands_to_the_runner(monkeypatch):
    assert set(PROGRAMS) <= set(recipe.RECIPES)
    started = []
    monkeypatch.setattr(recipe, "run", lambda program, argv: started.append((program.command, argv)) or 0)
    for command, (main, _) in PROGRAMS.items():
        assert main(["seed=1"]) == 0
    assert started == [(command, ["seed=1"]) for command in PROGRAMS]


@pytest.mark.parametrize("command", list(PROGRAMS))
def test_a_second_orchestrator_on_a_locked_run_dir_gets_one_refusal_from_every_program(tmp_path, caplog, command):
    main, args = PROGRAMS[command]
    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO)
    with RunLock(RunStore(run_dir).lock_path):
        assert main([f"run_dir={run_dir}", "new=true", *args]) == LOCKED_EXIT
    refusals = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [(r.name, r.getMessage().split(": its LOCK is")[0]) for r in refusals] == [
        ("meta.search.lock", f"{run_dir} is in use by another orchestrator")]
    assert not RunStore(run_dir).config_path.exists()  # nothing written under another orchestrator's lock
