"""The one upgrade step for what an earlier version stored (meta/settings/upgrade.py): a search stored by each earlier
layout resumes as the same search through it, no entry point renames on its own, and no registry entry outlives the
oldest supported layout."""
from __future__ import annotations

import ast
import datetime as dt
import importlib
import logging
from pathlib import Path

import pytest
import torch
import yaml

from launch.member import load_program
from meta.search.config import build_search_config, config_hash
from meta.search.run import main
from meta.settings import upgrade
from meta.settings.keys import UNWRITTEN_MODEL_KEYS
from meta.settings.schema import ConfigError
from meta.settings.upgrade import (CONFIG_STEPS, EARLIER_READERS, OLDEST_SUPPORTED_LAYOUT, REGISTRY, RETIRED_SETTINGS,
                                   STORED_NAMES,
                                   AddedKey, DivergenceSchemaDefaults, GroupSchemaDefaults, RadiusRenamed,
                                   UnsupportedLayout,
                                   stored_config, stored_manifest, upgraded)
from results.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[3]
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "reevaluate.top_k=0", "es=pgpe",
         "es.radius=0.05"]
#: the stored layouts, oldest first: before each change of CONFIG_STEPS (the index of its first step, its commit)
LAYOUTS = [(i, step.commit) for i, step in enumerate(CONFIG_STEPS)
           if step.commit not in {s.commit for s in CONFIG_STEPS[:i]}]


def _undo(step: upgrade.ConfigStep, raw: dict, overrides: list[str]) -> list[str]:
    """Rewrite a stored config and command line of today's layout as a run from before ``step`` stored them."""
    if isinstance(step, AddedKey):
        *parents, leaf = step.key.split(".")
        node = raw
        for part in parents:
            node = node[part]
        assert node.pop(leaf) == step.value  # the value that reproduces the run
    elif isinstance(step, RadiusRenamed):  # pgpe's own key and the root key the presets set it through
        raw["es"]["stdev_init"] = raw["es"].pop("radius")
        raw["search_radius"] = raw["es"]["stdev_init"]
        overrides = [o.replace("es.radius=", "search_radius=") for o in overrides]
    elif isinstance(step, DivergenceSchemaDefaults):
        pass  # the learned map's YAML lacked only estimator (an added key); none's lacked form: tested below
    elif isinstance(step, GroupSchemaDefaults) and step.group == "es":
        del raw["es"]["optimizer_config"]  # pgpe's YAML did not write it: its constructor's default then
    elif isinstance(step, GroupSchemaDefaults) and step.group == "model":
        for key in UNWRITTEN_MODEL_KEYS[raw["model"]["name"]]:
            del raw["model"][key]
    else:
        raise AssertionError(f"no earlier layout is written for {step!r}: add it here")
    return overrides


def _store_as_of(store: RunStore, layout: tuple[int, str]) -> None:
    """Rewrite a run dir as the layout before the change of ``layout`` and every later one."""
    raw = yaml.safe_load(store.read_config_text())
    manifest = store.read_manifest()
    overrides = list(manifest["overrides"])
    for step in reversed(CONFIG_STEPS[layout[0]:]):
        overrides = _undo(step, raw, overrides)
    store.write_config(yaml.safe_dump(raw, sort_keys=True))
    store.write_manifest({**manifest, "overrides": overrides})


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> RunStore:
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=2"]) == 0
    return RunStore(run_dir)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"before_{commit}" for _, commit in LAYOUTS])
def test_a_search_stored_by_an_earlier_layout_resumes_as_the_same_search(layout, whole, tmp_path, caplog):
    run_dir = tmp_path / "old"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=1"]) == 0
    old = RunStore(run_dir)
    today = stored_config(old)
    _store_as_of(old, layout)
    stored = yaml.safe_load(old.read_config_text())
    assert stored != today  # the layout differs from today's ...
    assert stored_config(old) == today  # ... and reads as it through the one upgrade
    assert config_hash(stored) == old.read_manifest()["config_hash"]  # and hashes as it did

    caplog.set_level(logging.INFO)
    assert main([f"run_dir={run_dir}", "generations=2"]) == 0
    assert "refused" not in caplog.text
    assert torch.allclose(old.read_population(1), whole.read_population(1), rtol=0, atol=1e-12)
    assert torch.allclose(old.read_state(1)["center"], whole.read_state(1)["center"], rtol=0, atol=1e-12)
    assert yaml.safe_load(old.read_config_text())["es"]["radius"] == 0.05  # rewritten in today's layout
    assert "es.radius=0.05" in old.read_manifest()["overrides"]


def test_a_divergence_stored_before_its_schema_reads_with_the_class_defaults():
    old_none = {"divergence": {"name": "none", "coef": 0.0, "grad_share_floor": None}}
    assert "form" in upgraded(old_none)["divergence"] and "form" not in old_none["divergence"]


def test_a_tuning_config_gets_its_own_root_steps_only(tmp_path):
    """A tuning's config.yaml (conf/tune.yaml) had the radius at the root and never had the search's keys."""
    store = RunStore(tmp_path)
    store.write_config(yaml.safe_dump({"seed": 1, "search_radius": 0.02, "divergence": {"name": "neural_mirror"}}))
    store.write_manifest({"kind": "tune", "overrides": ["search_radius=0.02", "seed=1"]})
    raw = stored_config(store)
    assert raw["es"] == {"radius": 0.02} and "search_radius" not in raw
    assert "seeds_per_member" not in raw and "early_stop" not in raw
    assert raw["divergence"]["estimator"] == "k3"
    assert stored_manifest(store)["overrides"] == ["es.radius=0.02", "seed=1"]
    store.write_manifest({"kind": "pilot"})  # a pilot's is conf/config.yaml's: the search's keys too
    assert stored_config(store)["seeds_per_member"] == 1


def test_a_config_of_todays_layout_reads_unchanged(whole):
    raw = yaml.safe_load(whole.read_config_text())
    assert upgraded(raw) == raw


def test_a_run_older_than_the_oldest_supported_layout_is_refused_naming_the_date(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    store.write_manifest({"created": f"{OLDEST_SUPPORTED_LAYOUT}T09:00:00", "code_version": "abc123"})
    assert stored_manifest(store)["created"].startswith(OLDEST_SUPPORTED_LAYOUT)
    later = (dt.date.fromisoformat(OLDEST_SUPPORTED_LAYOUT) + dt.timedelta(days=1)).isoformat()
    monkeypatch.setattr(upgrade, "OLDEST_SUPPORTED_LAYOUT", later)
    with pytest.raises(UnsupportedLayout, match=rf"created on {OLDEST_SUPPORTED_LAYOUT}, before {later}.*abc123"):
        stored_manifest(store)


def test_an_nres_search_stored_with_a_setting_its_algorithm_retired_is_refused_saying_when_and_why(tmp_path, capsys):
    """es=nres before 61f9129 moved its centre by Adam after every truncation (es.center_learning_rate): no step can
    upgrade that search, and its resume says so, naming the commit, before anything is written (it read as a
    mistyped key before)."""
    run_dir = tmp_path / "old_nres"
    nres = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "reevaluate.top_k=0",
            "es=nres", "train.steps=8", "es.truncation_steps=4"]
    assert main([f"run_dir={run_dir}", "new=true", *nres, "generations=1"]) == 0
    store = RunStore(run_dir)
    raw = yaml.safe_load(store.read_config_text())
    for key in ("update", "step_radii", "average"):  # what that nres stored: these came with 61f9129
        del raw["es"][key]
    raw["es"].update(optimizer="adam", center_learning_rate=0.02, stagger=False)
    store.write_config(yaml.safe_dump(raw, sort_keys=True))
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main([f"run_dir={run_dir}", "generations=2"]) == 2
    said = capsys.readouterr().err
    assert "es.center_learning_rate is a setting of es=nres before 2026-12-06 (commit 61f9129)" in said, said
    assert "unknown key" not in said
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before
    with pytest.raises(ConfigError, match=r"es.center_learning_rate is a setting of es=nres before .*61f9129"):
        build_search_config(stored_config(store))  # its typed read too (the selection stage's, say)


# ------------------------------------------------------------------------------------------------ the removal rule
def test_no_entry_outlives_the_oldest_supported_layout():
    """The rule: an entry may go once every supported run was created after the day it landed. Raising
    OLDEST_SUPPORTED_LAYOUT past an entry's day fails here until the entry (and what keeps it) is removed."""
    stale = [entry for entry in REGISTRY if entry.removable()]
    assert not stale, "remove these (no supported stored run needs them):\n" + "\n".join(map(repr, stale))


def test_an_entry_becomes_removable_the_day_after_the_oldest_supported_layout_passes_it():
    step = CONFIG_STEPS[0]
    assert not step.removable(step.since)
    assert step.removable((dt.date.fromisoformat(step.since) + dt.timedelta(days=1)).isoformat())


@pytest.mark.parametrize("table", [CONFIG_STEPS, STORED_NAMES, EARLIER_READERS, RETIRED_SETTINGS],
                         ids=["config", "names", "readers", "retired"])
def test_each_list_is_oldest_first_with_dated_commits(table):
    days = [entry.since for entry in table]
    assert days == sorted(days)
    for entry in table:
        dt.date.fromisoformat(entry.since)
        assert len(entry.commit) >= 7 and int(entry.commit, 16) >= 0 and entry.what


@pytest.mark.parametrize("name", STORED_NAMES, ids=lambda n: n.old)
def test_each_stored_name_loads_what_it_names_now(name):
    assert (ROOT / name.kept_by).is_file()
    if ":" not in name.old:
        assert importlib.import_module(name.old) is importlib.import_module(name.new)
    elif name.new.endswith(":program"):  # an entry point: the same member program
        assert load_program(name.old) == load_program(name.new)
    else:
        (old_module, old_attr), (new_module, new_attr) = (n.split(":") for n in (name.old, name.new))
        assert getattr(importlib.import_module(old_module), old_attr) is \
            getattr(importlib.import_module(new_module), new_attr)


@pytest.mark.parametrize("reader", EARLIER_READERS, ids=lambda r: r.where)
def test_each_earlier_reader_names_code_that_exists(reader):
    module, qualname = reader.where.split(":")
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    assert callable(target)


# ---------------------------------------------------------------------------------- one upgrade, no entry point's own
#: the readers of a run dir's files outside the upgrade: results.report may import no meta (the layers), and reads
#: only keys no step changes (population, seeds_per_member, the manifest's kind and provenance)
READERS_OUTSIDE = {"results/report/search/report.py", "results/report/search/snapshot.py", "results/report/pilot.py",
                   "results/report/tune.py"}


def _sources():
    for package in ("core", "meta", "launch", "results", "inner_loop"):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def test_only_the_upgrade_reads_a_run_dirs_config_and_manifest():
    calls = {rel for rel, tree in _sources() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in ("read_config_text", "read_manifest")}
    assert calls - READERS_OUTSIDE == {"meta/settings/upgrade.py"}


def test_the_former_names_are_written_only_in_the_upgrade():
    """A rename added back at an entry point (``es.pop("stdev_init")``, ``raw.get("search_radius")``) fails here."""
    former = {*upgrade.FORMER_RADIUS_KEYS, upgrade.FORMER_ROOT_RADIUS_KEY} - {"sigma"}  # "sigma": openai_es's state
    found = set()
    for rel, tree in _sources():
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        found |= {rel for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in former
                  and id(node) not in docstrings}
    assert found == {"meta/settings/upgrade.py"}

