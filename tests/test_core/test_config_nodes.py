"""One owner per reading: config nodes become typed objects through core/config/typed_nodes.py alone, and our
keys reach TRL's GRPOConfig through one table (inner_loop/trl_settings/fields.py GRPO_FIELDS).

Why tests for it: a second reader or a second table creeps back in quietly (a helper written "just for this
node"), and then the inner config and a task config accept different values, or the build and the error message
name different keys. These tests fail when that happens.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from inner_loop.config import DivergenceConfig, InnerConfig, ModelConfig, TrainConfig
from inner_loop.grpo import args as grpo_args
from inner_loop.trl_settings.trl_overrides import OWNED_FIELDS
from inner_loop.tasks import TASK_CONFIGS
from inner_loop.tasks.task_config import config_from_mapping
from core.config.plain_data import plain
from core.config.typed_nodes import typed_node
from results.store.provenance import config_hash
from helpers import inner_config

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "meta", "inner_loop", "mirror_maps", "launch", "results")


def _inner(**train) -> dict:
    return inner_config("neural_mirror", **train)


def _config_error(node: str, key: str, value) -> str:
    inner = _inner()
    inner[node][key] = value
    with pytest.raises(ValueError) as error:
        InnerConfig.from_dict(inner)
    return str(error.value)


def _task_error(task: str, key: str, value) -> str:
    with pytest.raises(ValueError) as error:
        config_from_mapping(TASK_CONFIGS[task], task, {"name": task, key: value})
    return str(error.value)


# --- the typed reading ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("node, key, task, task_key, value, says", [
    ("train", "scale_rewards", "arith", "allow_negative", "yes", "must be true or false, got 'yes'"),
    ("train", "steps", "arith", "seed", "many", "must be an integer, got 'many'"),
    ("train", "steps", "arith", "seed", None, "must not be null"),
    ("train", "learning_rate", "mbpp", "timeout_s", "fast", "must be a number, got 'fast'"),
    ("model", "dtype", "arith", "prompt_template", 3, "must be a string, got 3"),
    ("model", "lora_target_modules", "arith", "operators", [1], "must be a list of strings, got [1]"),
    ("train", "trl", "mbpp", "sandbox", [1], "must be a mapping, got [1]"),
])
def test_the_inner_config_and_a_task_config_refuse_a_bad_value_in_the_same_words(node, key, task, task_key, value,
                                                                                 says):
    assert _config_error(node, key, value) == f"{node}.{key} {says}"
    assert _task_error(task, task_key, value) == f"task {task!r}: task.{task_key} {says}"


def test_both_readers_read_a_number_yaml_left_as_a_string():
    """YAML 1.1 reads 1e-3 (no dot) as a string; every number field reads it as the number it means."""
    inner = _inner(learning_rate="1e-3")
    assert InnerConfig.from_dict(inner).train.learning_rate == 0.001
    assert config_from_mapping(TASK_CONFIGS["mbpp"], "mbpp", {"name": "mbpp", "timeout_s": "1e1"}).timeout_s == 10.0


def test_both_readers_name_an_unknown_key_in_the_same_words():
    known = sorted(f.name for f in dataclasses.fields(TrainConfig))
    assert _config_error("train", "stepz", 3) == (f"unknown key(s) ['train.stepz'] (did you mean train.steps?); "
                                                  f"known keys are {known}")
    known = sorted(f.name for f in dataclasses.fields(TASK_CONFIGS["arith"]))
    assert _task_error("arith", "stepz", 3) == (f"task 'arith': unknown key(s) ['task.stepz']; known keys are {known}"
                                                " (see conf/task/arith.yaml)")


@pytest.mark.parametrize("cls", [ModelConfig, DivergenceConfig, TrainConfig, *TASK_CONFIGS.values()],
                         ids=lambda cls: cls.__name__)
def test_every_field_of_every_config_node_has_a_reading_rule_its_default_passes(cls):
    """A field whose annotation the reading has no rule for fails here, not in a user's run."""
    default = cls()
    assert typed_node(cls, dataclasses.asdict(default), "node") == default


def test_omegaconf_containers_read_as_the_plain_data_they_hold():
    data = {"a": {"b": [1, {"c": (2, 3)}]}, 4: "four"}
    expected = {"a": {"b": [1, {"c": [2, 3]}]}, "4": "four"}
    assert plain(data) == expected
    assert plain(OmegaConf.create({"a": {"b": [1, {"c": [2, 3]}]}, "4": "four"})) == expected
    assert config_hash(OmegaConf.create(expected)) == config_hash(expected)


def _functions(predicate) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for function in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and predicate(function):
                    found.append(f"{path.relative_to(ROOT)}:{function.name}")
    return sorted(set(found))


def _rebuilds_mappings_recursively(function: ast.FunctionDef) -> bool:
    """``{k: <this function>(v) for k, v in value.items()}``: a hand-written plain-data conversion."""
    return any(isinstance(node, ast.DictComp) and isinstance(node.value, ast.Call)
               and isinstance(node.value.func, ast.Name) and node.value.func.id == function.name
               for node in ast.walk(function))


def _reads_annotations(function: ast.FunctionDef) -> bool:
    return any(isinstance(node, ast.Call) and "get_type_hints" in (getattr(node.func, "attr", None),
                                                                   getattr(node.func, "id", None))
               for node in ast.walk(function))


def test_plain_data_conversion_is_written_once():
    """meta/searchers/serialize.py is no config reading: it keeps a searcher's NamedTuples and tuples as tagged
    JSON so that they come back as they were, which config data must not."""
    assert _functions(_rebuilds_mappings_recursively) == [
        "core/config/plain_data.py:plain", "meta/searchers/serialize.py:from_plain", "meta/searchers/serialize.py:to_plain"]


def test_values_are_typed_from_annotations_in_one_place():
    """trl_overrides reads TRL's GRPOConfig annotations (TRL's vocabulary, not a config node of ours)."""
    assert _functions(_reads_annotations) == ["core/config/typed_nodes.py:typed_node",
                                              "inner_loop/trl_settings/trl_overrides.py:_field_hints"]


# --- the GRPOConfig table ------------------------------------------------------------------------------------------


def _grpo_config_fields() -> set[str]:
    from trl import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig) if f.init}


def test_every_table_entry_joins_a_key_of_ours_to_a_real_grpo_config_field():
    cfg = InnerConfig.from_dict(_inner())
    fields = [entry.name for entry in grpo_args.GRPO_FIELDS.values()]
    assert set(fields) <= _grpo_config_fields()
    assert len(fields) == len(set(fields)), "two keys set one GRPOConfig field"
    for key in grpo_args.GRPO_FIELDS:
        node, _, leaf = key.partition(".")
        assert leaf in {f.name for f in dataclasses.fields(getattr(cfg, node))}, key
    assert set(grpo_args.FIXED_FIELDS) <= _grpo_config_fields()


@pytest.mark.parametrize("trl", [{}, {"gradient_accumulation_steps": 4}])
def test_every_keyword_built_comes_from_the_table_or_the_fixed_settings(tmp_path, trl):
    cfg = InnerConfig.from_dict(_inner(trl=trl))
    kwargs, sources = grpo_args.grpo_kwargs(cfg, tmp_path, 0, use_cpu=True, gpu_member=False)
    from_table = {entry.name: key for key, entry in grpo_args.GRPO_FIELDS.items()}
    per_build = {"output_dir", "seed", "data_seed", "use_cpu"}
    assert set(kwargs) == set(from_table) | set(grpo_args.FIXED_FIELDS) | per_build
    passed = {field: f"train.trl.{field}" for field in trl}
    split = {"per_device_train_batch_size": "train.batch_size / train.trl.gradient_accumulation_steps"} if trl else {}
    assert sources == {**from_table, **passed, **split}


@pytest.mark.parametrize("key", sorted(grpo_args.GRPO_FIELDS))
def test_a_value_grpo_config_rejects_is_named_by_its_table_key(tmp_path, monkeypatch, key):
    field = grpo_args.GRPO_FIELDS[key].name

    def construct(kwargs):
        if field in kwargs:
            raise ValueError(f"{field} is wrong")
        return kwargs

    monkeypatch.setattr(grpo_args, "_construct", construct)
    with pytest.raises(ValueError) as error:
        grpo_args.build_grpo_config(InnerConfig.from_dict(_inner()), tmp_path, 0, check_only=True)
    assert str(error.value).startswith(f"{key}: rejected by TRL's GRPOConfig"), str(error.value)


def test_the_refusal_in_train_trl_names_the_key_the_table_sets_the_field_from():
    """train.trl refuses every field the table owns, naming its key, and only those plus the documented others:
    there is no second listing of which key sets which field (bf16 is a default train.trl may change)."""
    from inner_loop.trl_settings import fields

    assert OWNED_FIELDS == fields.owned_fields()
    for key, entry in fields.GRPO_FIELDS.items():
        if entry.owned:
            assert OWNED_FIELDS[entry.name].startswith(key), (key, entry.name)
        else:
            assert entry.name not in OWNED_FIELDS
    assert set(OWNED_FIELDS) - {e.name for e in fields.GRPO_FIELDS.values()} == set(fields.OTHER_OWNED)

@pytest.mark.parametrize("node", ["reevaluate", "early_stop", "pilot", "tune", "launcher"])
def test_every_settings_node_refuses_an_unknown_key_in_the_same_words(node):
    """One reader of unknown keys (refuse_unknown_keys) for every node the commands build by hand."""
    from launch.slurm.options import SlurmOptions
    from meta.compose import CONF_DIR, compose
    from meta.search.config import build_search_config
    from meta.pilot.cli import build_pilot_config
    from meta.tune.config import build_tune_config

    def bogus(config_name: str = "config") -> dict:
        """The composed config with the bogus key in the node (the command line refuses it earlier, in compose)."""
        raw = compose([], config_name=config_name)
        raw[node]["bogus"] = 1
        return raw

    build = {
        "reevaluate": lambda: build_search_config(bogus()),
        "early_stop": lambda: build_search_config(bogus()),
        "pilot": lambda: build_pilot_config(bogus()),
        "tune": lambda: build_tune_config(bogus("tune"), CONF_DIR, lambda group, value: {}),
        "launcher": lambda: SlurmOptions.from_options({"bogus": 1}),
    }[node]
    with pytest.raises(ValueError, match=re.escape(f"unknown key(s) ['{node}.bogus']; known keys are [")):
        build()
