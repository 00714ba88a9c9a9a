"""Every bad inner-config input fails before training with a message naming the key; pass@k is unbiased."""
from __future__ import annotations

import copy
import math
from itertools import combinations
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from inner_loop.config import InnerConfig
from inner_loop.training.evaluate import pass_at_k
from inner_loop.member.lifecycle import train_in_process
from inner_loop.training.setup import prepare, validate_inner
from mirror_maps import NeuralMirrorMap, save_init
from time_limits import run_with_progress
from helpers import inner_config

CONF = Path(__file__).resolve().parents[2] / "conf"


def _inner(divergence: str = "neural_mirror") -> dict:
    return inner_config(divergence)


def _with(node: str, key: str, value, divergence: str = "neural_mirror") -> dict:
    inner = _inner(divergence)
    inner[node][key] = value
    return inner


def test_shipped_configs_parse():
    for name in ("none", "kl", "prob_l2", "neural_mirror"):
        cfg = InnerConfig.from_dict(_inner(name))
        assert cfg.divergence.name == name
    cfg = InnerConfig.from_dict(_inner())
    assert cfg.train.batch_size % cfg.train.group_size == 0 and cfg.train.aggregation == "dr_grpo"


@pytest.mark.parametrize(
    "node,key,value,message",
    [
        ("model", "name", "gpt5", "model.name"),
        ("divergence", "name", "wasserstein", "divergence.name"),
        ("divergence", "form", "dense", "divergence.form"),
        ("divergence", "estimator", "k4", "divergence.estimator"),
        ("divergence", "coef", -0.1, "divergence.coef"),
        ("train", "group_size", 1, "train.group_size"),
        ("train", "batch_size", 30, "train.batch_size"),
        ("train", "policy_loss", "ppo2", "train.policy_loss"),
        ("train", "aggregation", "sum", "train.aggregation"),
        ("train", "steps", -1, "train.steps"),
        ("train", "learning_rate", "fast", "train.learning_rate"),
        ("train", "stepz", 3, "train.stepz"),
        ("divergence", "init", "/nonexistent/map.pt", "divergence.init"),
    ],
)
def test_bad_config_values_name_the_key(node, key, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        InnerConfig.from_dict(_with(node, key, value))


def test_the_learned_map_s_keys_are_its_own_config_class_s():
    """``init`` and ``param_transform`` are NeuralMirrorConfig's, read from the same YAML keys; another divergence
    refuses them naming the divergence that takes them."""
    cfg = InnerConfig.from_dict(_with("divergence", "param_transform", "softplus"))
    assert type(cfg.divergence).__name__ == "NeuralMirrorConfig" and cfg.divergence.param_transform == "softplus"
    kl = InnerConfig.from_dict(_inner("kl")).divergence
    assert not hasattr(kl, "init") and not hasattr(kl, "param_transform")
    for key, value in (("init", None), ("param_transform", "abs")):
        with pytest.raises(ValueError, match=rf"divergence\.{key} only applies to divergence=neural_mirror"):
            InnerConfig.from_dict(_with("divergence", key, value, divergence="kl"))


@pytest.mark.parametrize("value", ["newest", "None", 1, True])
def test_keep_checkpoints_names_the_key_and_the_allowed_values(value):
    with pytest.raises(ValueError, match=r"train\.keep_checkpoints") as error:
        InnerConfig.from_dict(_with("train", "keep_checkpoints", value))
    if isinstance(value, str):
        assert "['none', 'last', 'all']" in str(error.value)


@pytest.mark.parametrize("value, ok", [(0, False), (-1, False), ("two", False), (1, True), (2, True), (None, True)])
def test_save_total_limit_is_a_positive_count_or_null(value, ok):
    inner = _with("train", "save_total_limit", value)
    if ok:
        assert InnerConfig.from_dict(inner).train.save_total_limit == value
    else:
        with pytest.raises(ValueError, match=r"train\.save_total_limit"):
            InnerConfig.from_dict(inner)


def test_checkpoint_policy_defaults_and_trainer_rotation():
    from inner_loop.trl_settings.fields import trainer_save_total_limit

    train = InnerConfig.from_dict(_inner()).train
    assert (train.keep_checkpoints, train.save_total_limit) == ("none", 1)
    assert [trainer_save_total_limit(k, 1) for k in ("none", "last", "all")] == [1, 1, None]


def test_missing_node_and_task_errors():
    inner = _inner()
    del inner["train"]
    with pytest.raises(ValueError, match="train"):
        InnerConfig.from_dict(inner)
    with pytest.raises(ValueError, match="unknown task"):
        prepare(_with("task", "name", "chess"), seed=0)


def test_missing_data_file_fails_in_prepare(tmp_path):
    inner = _inner()
    inner["task"] = {"name": "gsm8k", "train_file": str(tmp_path / "absent.jsonl")}
    with pytest.raises(ValueError, match="absent.jsonl"):
        prepare(inner, seed=0)


def test_init_file_of_wrong_shape_is_rejected_before_training(tmp_path):
    bad = tmp_path / "bad.pt"
    save_init(tmp_path / "good.pt", NeuralMirrorMap.random_init(1))
    with safe_open(str(tmp_path / "good.pt"), framework="pt") as handle:
        header = handle.metadata()
    bad.write_bytes(safetensors.torch.save({"vector": torch.zeros(12, dtype=torch.float64)}, header))
    spec = {"run_id": "r", "generation": 0, "index": 0, "seed": 0, "params": [], "work_dir": str(tmp_path / "m"),
            "inner": _with("divergence", "init", str(bad))}
    with pytest.raises(ValueError, match="380"):
        validate_inner(spec["inner"])  # the orchestrator's up-front check: raises, writes nothing
    assert not (tmp_path / "m").exists()
    record = train_in_process(spec)  # a member that gets it anyway ends as a failed record, never a bare exception
    assert record.status == "failed" and "380" in record.error and (tmp_path / "m" / "result.json").is_file()


def test_good_init_file_is_accepted(tmp_path):
    path = tmp_path / "map.pt"
    save_init(path, NeuralMirrorMap.random_init(3))
    from inner_loop.loss.regularizers import build_regularizer

    cfg = InnerConfig.from_dict(_with("divergence", "init", str(path)))
    reg = build_regularizer(cfg.divergence)
    torch.testing.assert_close(reg.potential.to_vector().float(), NeuralMirrorMap.random_init(3).to_vector().float())


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 2), (6, 3, 4), (4, 4, 2), (10, 1, 3)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k))
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 5)


def test_config_is_not_mutated():
    inner = _inner()
    before = copy.deepcopy(inner)
    InnerConfig.from_dict(inner)
    assert inner == before


def test_cli_exits_2_on_a_config_error_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    work = tmp_path / "run"
    proc = run_with_progress([sys.executable, "-m", "inner_loop.run", "train.batch_size=30", f"work_dir={work}"],
                             cwd=CONF.parent)
    assert proc.returncode == 2
    assert "train.batch_size" in proc.stderr
    assert not work.exists()
    # a value the train group's schema refuses while composing: the same exit, naming the key and the schema
    proc = run_with_progress([sys.executable, "-m", "inner_loop.run", "train.steps=abc", f"work_dir={work}"],
                             cwd=CONF.parent)
    assert proc.returncode == 2 and not work.exists()
    assert ("train.steps=abc: Value 'abc' of type 'str' could not be converted to Integer (the type and default of "
            "train.steps: inner_loop/config.py TrainConfig)") in proc.stderr
