"""The dataclass schemas (meta/settings/schema.py) are the one home of every root key's type, default and range:
conf/*.yaml only choose and override, a bad value is refused naming the key before anything is written, and a run
whose config was stored before the schema (or by a version with other root keys) still resumes."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from meta.compose import CONF_DIR, compose
from meta.search.config import ConfigError, build_search_config, config_hash
from meta.settings.upgrade import upgraded
from meta.search.run import main
from meta.settings.schema import SearchSchema, TuneSchema
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4"]


def _defaults(schema: type, prefix: str = "") -> dict[str, object]:
    """Every dotted key of a schema with its default (a node's keys inside it)."""
    out: dict[str, object] = {}
    for value_field in dataclasses.fields(schema):
        default = (value_field.default_factory() if value_field.default_factory is not dataclasses.MISSING
                   else value_field.default)
        if dataclasses.is_dataclass(default):
            out.update(_defaults(type(default), f"{prefix}{value_field.name}."))
        else:
            out[prefix + value_field.name] = default
    return out


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + str(key)] = value
    return out


@pytest.mark.parametrize(("name", "schema"), [("config", SearchSchema), ("tune", TuneSchema)])
def test_the_root_yaml_repeats_no_default_of_its_schema(name, schema):
    """A default written in the YAML too would be a second home that can drift from the first."""
    text = yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text())
    defaults = _defaults(schema)
    repeated = {key: value for key, value in _leaves(text).items()
                if key != "defaults" and key in defaults and defaults[key] == value}
    assert repeated == {}
    assert compose([], config_name=name)["seed"] == schema.seed  # the composed config takes the schema's default


@pytest.mark.parametrize("path", sorted([*(CONF_DIR / "train").glob("*.yaml"), *(CONF_DIR / "divergence").glob("*.yaml")]),
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_train_or_divergence_yaml_names_its_schema_and_repeats_none_of_its_defaults(path):
    """conf/train/*.yaml compose on TrainConfig, conf/divergence/<name>.yaml on its divergence's config class
    (inner_loop.config.register_schemas): a value the YAML repeats would be a second home of that default."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from inner_loop.config import register_schemas

    register_schemas()
    body = yaml.safe_load(path.read_text())
    schema = (f"{path.stem}_schema" if path.parent.name == "divergence" else "schema")
    assert body.get("defaults") == [schema, "_self_"]
    defaults = OmegaConf.to_container(ConfigStore.instance().load(f"{path.parent.name}/{schema}.yaml").node)
    assert {key: value for key, value in body.items() if key != "defaults" and defaults.get(key) == value} == {}


@pytest.mark.parametrize("path", sorted(path for group in ("es", "launcher", "model", "task")
                                        for path in (CONF_DIR / group).glob("*.yaml")),
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_an_es_launcher_model_or_task_yaml_names_its_schema_and_repeats_none_of_its_defaults(path):
    """conf/es/<name>.yaml composes on its searcher's settings class (meta.searchers.register_schemas),
    conf/launcher/<name>.yaml on its launcher's (launch.factory.register_schemas), whose every field carries its help,
    conf/model/<name>.yaml on ModelConfig with its name, conf/task/<name>.yaml on its task's config class
    (inner_loop.config.register_schemas): a value the YAML repeats would be a second home of that default."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from launch.factory import launchers
    from meta.searchers import searcher_class, settings_class_of
    from meta.settings.schema import register

    register()
    group = path.parent.name
    body = yaml.safe_load(path.read_text())
    assert body.get("defaults") == [f"{path.stem}_schema", "_self_"]
    defaults = OmegaConf.to_container(ConfigStore.instance().load(f"{group}/{path.stem}_schema.yaml").node)
    assert {key: value for key, value in body.items() if key != "defaults" and defaults.get(key) == value} == {}
    if group in ("es", "launcher"):
        settings = settings_class_of(searcher_class(path.stem)) if group == "es" else launchers()[path.stem].settings_class
        assert all(f.metadata.get("help") for f in dataclasses.fields(settings))
    assert compose([f"{group}={path.stem}"])[group]["name"] == path.stem


@pytest.mark.parametrize(("body", "says"), [
    ("train:\n  stepz: 3\n", "train.stepz in experiment/mine: Key 'stepz' not in 'TrainConfig' (did you mean "
                              "train.steps?) (the type and default of train.stepz: inner_loop/config.py TrainConfig)"),
    ("divergence:\n  chunk_size: many\n", "divergence.chunk_size in experiment/mine: Value 'many' of type 'str' "
                                           "could not be converted to Integer"),
])
def test_a_preset_s_bad_train_or_divergence_key_is_refused_naming_it_and_the_file(tmp_path, body, says):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n" + body)
    with pytest.raises(ConfigError) as refused:
        compose(["experiment=mine", f"hydra.searchpath=[file://{tmp_path}]"])
    assert str(refused.value).startswith(says)


@pytest.mark.parametrize(("override", "fragment"), [
    ("population=abc", "population=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ("early_stop.margin=abc", "early_stop.margin=abc"),
    ("pilot.radii=0.01", "pilot.radii=0.01"),
    ("resources.gpus=1.5", "resources.gpus=1.5"),
    ("quorum=2", "quorum=2.0 must be between 0.0 and 1.0"),
    ("straggler_grace=-1", "straggler_grace=-1.0 must be >= 0.0"),
    ("resources.timeout_factor=0.5", "resources.timeout_factor=0.5 must be >= 1.0"),
    ("reevaluate.top_k=-1", "reevaluate.top_k=-1 must be an integer >= 0"),
    ("fitness_on_failure=nan", "fitness_on_failure=nan must be a finite number"),
    ("train.steps=abc", "train.steps=abc: Value 'abc' of type 'str' could not be converted to Integer (the type and "
                        "default of train.steps: inner_loop/config.py TrainConfig)"),
    ("divergence.chunk_size=x", "divergence.chunk_size=x: Value 'x'"),
    ("es.step_radii=abc", "es.step_radii=abc: Value 'abc' of type 'str' could not be converted to Float (the type and "
                          "default of es.step_radii: meta/searchers/, the searcher's settings class)"),
    ("es.stepradii=1", "es.stepradii=1: conf/config.yaml has no key 'es.stepradii'; did you mean es.step_radii,"),
    ("+es.stepradii=1", "es.stepradii"),
    ("launcher.kill_grace_s=soon", "launcher.kill_grace_s=soon: Value 'soon' of type 'str' could not be converted to "
                                   "Float (the type and default of launcher.kill_grace_s: launch/, the launcher's "
                                   "settings class)"),
    ("+launcher.partition=gpu", "launcher.partition"),
    ("task.train_size=many", "task.train_size=many: Value 'many' of type 'str' could not be converted to Integer (the "
                             "type and default of task.train_size: inner_loop/tasks/, the task's config class)"),
    ("model.lora_r=x", "model.lora_r=x: Value 'x' of type 'str' could not be converted to Integer (the type and "
                       "default of model.lora_r: inner_loop/models/model_config.py ModelConfig)"),
])
def test_a_bad_value_exits_2_naming_the_key_before_anything_is_written(tmp_path, capsys, override, fragment):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, override]) == 2
    assert fragment in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_stored_config_reads_through_the_schema_with_its_defaults_and_its_old_root_keys():
    """meta.reevaluate builds the search config from a run's stored config.yaml: a key the schema added since is
    read at its default, a root key the writing version had and this one lacks is left alone, and a bad value in a
    node is still refused naming it."""
    raw = compose([*SYNTH])
    del raw["quorum"], raw["reevaluate"]["top_k"]
    raw["a_root_key_of_an_older_version"] = 0.1
    cfg = build_search_config(raw)
    assert cfg.quorum == SearchSchema.quorum and cfg.reevaluate.top_k == 3
    raw["reevaluate"]["seeds"] = "three"
    with pytest.raises(ConfigError, match=r"reevaluate\.seeds"):
        build_search_config(raw)


def test_a_search_stored_before_the_schema_resumes(tmp_path, caplog):
    """Before the schema, integral minutes were stored as integers (member_time_min: 2), and a version may store
    root keys this one lacks: neither is a change of the search, and its hash is what it was."""
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=1"]) == 0
    store = RunStore(run_dir)
    stored = yaml.safe_load(store.read_config_text())
    before = config_hash(stored)
    resources = stored["resources"]
    resources["member_time_min"], resources["overhead_min"] = int(resources["member_time_min"]), 0
    stored["a_root_key_of_an_older_version"] = 0.1
    store.write_config(yaml.safe_dump(stored, sort_keys=True))
    assert config_hash(stored) == before
    assert main([f"run_dir={run_dir}", "generations=2"]) == 0
    assert len(store.state_generations()) == 2
    assert "refused" not in caplog.text


def test_a_search_stored_before_the_group_schemas_resumes_and_hashes_as_it_did(tmp_path, caplog):
    """Before conf/divergence/*.yaml composed on their config classes, the learned map's node had no ``estimator``
    (none's no ``form`` either): the stored node ran with the class's defaults, so neither is a change of the
    search, and its hash is what it was."""
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "generations=1"]) == 0
    store = RunStore(run_dir)
    stored = yaml.safe_load(store.read_config_text())
    before = config_hash(stored)
    del stored["divergence"]["estimator"]
    store.write_config(yaml.safe_dump(stored, sort_keys=True))
    assert config_hash(stored) == before
    assert main([f"run_dir={run_dir}", "generations=2"]) == 0
    assert len(store.state_generations()) == 2
    assert "refused" not in caplog.text
    old_none = {"divergence": {"name": "none", "coef": 0.0, "grad_share_floor": None}}
    assert upgraded(old_none)["divergence"] == compose(["divergence=none"])["divergence"]


def test_a_search_stored_before_the_es_and_model_schemas_resumes_and_hashes_as_it_did(tmp_path, caplog):
    """Before conf/es/*.yaml composed on their searchers' settings classes, es=pgpe's node had no
    ``optimizer_config`` (its constructor's default then, its schema's now), and before conf/model/*.yaml composed on
    ModelConfig the tiny model's node had no ``lora_alpha`` and four more: the stored nodes ran with those defaults,
    so they are no change of the search, and the hash, of the stored config and of the config composed on resume, is
    what it was."""
    from meta.settings.keys import UNWRITTEN_MODEL_KEYS

    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "es=pgpe", "generations=1"]) == 0
    store = RunStore(run_dir)
    stored = yaml.safe_load(store.read_config_text())
    composed_hash = config_hash(stored)
    del stored["es"]["optimizer_config"]
    for key in UNWRITTEN_MODEL_KEYS["tiny"]:
        del stored["model"][key]
    store.write_config(yaml.safe_dump(stored, sort_keys=True))
    assert config_hash(stored) == composed_hash == "87dda153bca508d4"  # what the version before the schemas gave
    assert main([f"run_dir={run_dir}", "generations=2"]) == 0
    assert len(store.state_generations()) == 2
    assert "refused" not in caplog.text
    assert store.read_manifest()["config_hash"] == composed_hash
    resumed = yaml.safe_load(store.read_config_text())
    assert {node: upgraded(stored)[node] for node in ("es", "model")} == {node: resumed[node]
                                                                              for node in ("es", "model")}
    changed = {**stored, "es": {**stored["es"], "optimizer_config": {"momentum": 0.5}}}
    assert config_hash(changed) != composed_hash  # set to another value, the key is hashed


def test_a_composition_repeated_in_one_process_is_hydra_s_once_and_a_copy_each_time(monkeypatch):
    """Hydra takes ~0.2 CPU-s a composition; a search's start composes the same config several times."""
    import meta.compose as composing

    monkeypatch.setattr(composing, "_COMPOSED", {})
    anew = []
    real = composing._compose_anew
    monkeypatch.setattr(composing, "_compose_anew", lambda *args: anew.append(args) or real(*args))
    first = compose(["population=6"])
    first["population"] = -1  # a caller's change to its own config reaches no other caller
    first["es"]["name"] = "changed"
    again = compose(["population=6"])
    assert len(anew) == 1 and again["population"] == 6 and again["es"]["name"] != "changed"
    assert compose(["population=8"])["population"] == 8 and len(anew) == 2


def test_an_edited_yaml_or_a_resolver_that_reads_the_environment_composes_anew(tmp_path, monkeypatch):
    (tmp_path / "experiment").mkdir()
    preset = tmp_path / "experiment" / "mine.yaml"
    overrides = ["experiment=mine", f"hydra.searchpath=[file://{tmp_path}]"]
    preset.write_text("# @package _global_\npopulation: 6\n")
    assert compose(overrides)["population"] == 6
    preset.write_text("# @package _global_\npopulation: 10\n")
    assert compose(overrides)["population"] == 10
    for where in ("a", "b"):
        monkeypatch.setenv("MIRROR_ES_TEST_RUN_DIR", str(tmp_path / where))
        assert compose(["run_dir=${oc.env:MIRROR_ES_TEST_RUN_DIR}"])["run_dir"] == str(tmp_path / where)
