"""es.radius, every searcher's one key for its search radius (meta/searchers/radius.py): a search started under the
former per-searcher keys resumes, hashes and reads as the same search; a former key on a new command line is refused."""
from __future__ import annotations

import pytest
import torch
import yaml

from meta.search.config import build_search_config, config_hash
from meta.search.run import main
from meta.settings.upgrade import stored_config
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "reevaluate.top_k=0"]


def _as_before_the_rename(store: RunStore, former: str, root: bool) -> None:
    """Rewrite a run dir as a search started before es.radius wrote it: the radius under the searcher's former key in
    config.yaml (and the root search_radius the presets set it through), the former key in the stored command line."""
    stored = yaml.safe_load(store.read_config_text())
    radius = stored["es"].pop("radius")
    stored["es"][former] = radius
    if root:
        stored["search_radius"] = radius
    store.write_config(yaml.safe_dump(stored, sort_keys=True))
    manifest = store.read_manifest()
    manifest["overrides"] = [(f"search_radius={radius}" if root else f"es.{former}={radius}")
                             if o.startswith("es.radius=") else o for o in manifest["overrides"]]
    store.write_manifest(manifest)


@pytest.mark.parametrize("es, former, root", [("pgpe", "stdev_init", False), ("openai_es_elite", "sigma", True)])
def test_a_search_started_under_the_former_key_resumes_as_the_same_search(es, former, root, tmp_path):
    args = [*SYNTH, f"es={es}", "es.radius=0.05"]
    assert main([f"run_dir={tmp_path / 'whole'}", "new=true", *args, "generations=2"]) == 0
    assert main([f"run_dir={tmp_path / 'old'}", "new=true", *args, "generations=1"]) == 0
    old = RunStore(tmp_path / "old")
    _as_before_the_rename(old, former, root)
    stored = yaml.safe_load(old.read_config_text())
    assert config_hash(stored) == old.read_manifest()["config_hash"]  # the same search's hash under either name
    assert build_search_config(stored_config(old)).es.radius == 0.05  # meta.reevaluate and meta.export read it so

    assert main([f"run_dir={tmp_path / 'old'}", "generations=2"]) == 0  # no "changes are refused on resume"
    whole = RunStore(tmp_path / "whole")
    assert torch.allclose(old.read_population(1), whole.read_population(1), rtol=0, atol=1e-12)
    assert torch.allclose(old.read_state(1)["center"], whole.read_state(1)["center"], rtol=0, atol=1e-12)
    assert yaml.safe_load(old.read_config_text())["es"]["radius"] == 0.05  # rewritten under today's key
    assert "es.radius=0.05" in old.read_manifest()["overrides"]


@pytest.mark.parametrize("former", ["es.stdev_init=0.02", "es.sigma_init=0.02", "es.sigma=0.02", "search_radius=0.02"])
def test_a_former_key_on_a_new_command_line_exits_2_naming_es_radius(former, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, former]) == 2
    assert "set es.radius=0.02" in capsys.readouterr().err
    assert not run_dir.exists()
