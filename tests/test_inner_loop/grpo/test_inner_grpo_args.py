"""`train.trl` reaches TRL's GRPOConfig, and every value that reaches it is checked before anything is submitted.

The up-front check (validate_inner, which the orchestrator calls before submitting) and the member build the
GRPOConfig with one function (inner_loop/grpo/args.py), so a value TRL rejects fails once, up front, naming the key.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from inner_loop.config import InnerConfig
from inner_loop.grpo.args import build_grpo_config, check_grpo_config
from inner_loop.trl_settings.trl_overrides import OWNED_FIELDS
from inner_loop.training.setup import validate_inner
from conf_groups import load_group
from helpers import inner_config

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"


def _inner(**train) -> dict:
    return inner_config("neural_mirror", **train)


def _trl(**trl) -> dict:
    return _inner(trl=trl)


def test_the_shipped_default_passes_nothing_through_and_keeps_tensorboard_to_our_callback(tmp_path):
    cfg = InnerConfig.from_dict(_inner())
    assert cfg.train.trl == {} and cfg.train.report_to == ["tensorboard"]
    args = build_grpo_config(cfg, tmp_path / "out", seed=5)
    # tensorboard is written by our own callback into the member's work dir, so TRL's list stays empty
    assert args.report_to == [] and args.gradient_accumulation_steps == 1
    assert args.per_device_train_batch_size == cfg.train.batch_size and args.seed == args.data_seed == 5
    assert args.beta == 0.0 and args.remove_unused_columns is False and not (tmp_path / "out").exists()


@pytest.mark.parametrize("key, suggestion", [("use_vlm", "train.trl.use_vllm"),
                                             ("vllm_gpu_memory_utilisation", "train.trl.vllm_gpu_memory_utilization"),
                                             ("gradient_accumulation_step", "train.trl.gradient_accumulation_steps")])
def test_an_unknown_field_is_refused_with_the_closest_names(key, suggestion):
    with pytest.raises(ValueError, match=rf"train\.trl\.{key} is not a field of TRL's GRPOConfig") as error:
        validate_inner(_trl(**{key: True}))
    assert suggestion in str(error.value)


def test_an_unknown_field_with_no_close_name_still_names_the_key():
    with pytest.raises(ValueError, match=r"train\.trl\.zzqx_frobnicate is not a field") as error:
        InnerConfig.from_dict(_trl(zzqx_frobnicate=1))
    assert "did you mean" not in str(error.value)


@pytest.mark.parametrize("key, value, expected", [
    ("use_vllm", "yes", "true/false"),
    ("vllm_gpu_memory_utilization", "lots", "a number"),
    ("gradient_accumulation_steps", 2.5, "an integer"),
    ("run_name", 7, "a string"),
    ("generation_kwargs", [1, 2], "a mapping"),
    ("reward_weights", ["a"], "list"),
])
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(key, value, expected):
    with pytest.raises(ValueError, match=rf"train\.trl\.{key} must be") as error:
        InnerConfig.from_dict(_trl(**{key: value}))
    assert expected in str(error.value)


def test_a_loss_option_our_loss_would_ignore_is_refused_in_parsing():
    """TRL's two-sided clipping (delta) acts in TRL's _compute_loss, which ours replaces: refused, not dropped."""
    with pytest.raises(ValueError, match=r"train\.trl\.delta=2\.0 is not honoured by the GBMPO loss"):
        InnerConfig.from_dict(_trl(delta=2.0))


def test_a_value_outside_a_closed_set_fails_up_front():
    """TRL itself checks vllm_mode only when the trainer starts (in every member): here it fails in parsing."""
    with pytest.raises(ValueError, match=r"train\.trl\.vllm_mode='collocate' is not one of \['server', 'colocate'\]"):
        InnerConfig.from_dict(_trl(use_vllm=True, vllm_mode="collocate"))


@pytest.mark.parametrize("trl, named", [
    ({"vllm_importance_sampling_clip_min": 3.0, "vllm_importance_sampling_clip_max": 2.0},
     "train.trl.vllm_importance_sampling_clip_min"),
    ({"fp16": True, "bf16": True}, "train.trl.bf16 or train.trl.fp16"),
    ({"auto_find_batch_size": True}, "train.trl.auto_find_batch_size"),
    ({"generation_batch_size": 100}, "train.trl.generation_batch_size"),
])
def test_a_value_grpo_config_rejects_fails_up_front_naming_the_key(trl, named):
    inner = _trl(**trl)
    InnerConfig.from_dict(inner)  # the types are right: only GRPOConfig itself can tell
    with pytest.raises(ValueError, match="rejected by TRL's GRPOConfig") as error:
        validate_inner(inner)
    assert str(error.value).startswith(named), str(error.value)


@pytest.mark.parametrize("field", sorted(OWNED_FIELDS))
def test_every_field_we_set_ourselves_is_refused_naming_the_key_to_use(field):
    with pytest.raises(ValueError, match=rf"train\.trl\.{field} is set by mirror-es itself; use ") as error:
        InnerConfig.from_dict(_trl(**{field: None}))
    assert OWNED_FIELDS[field] in str(error.value)


@pytest.mark.parametrize("field, key", [("learning_rate", "train.learning_rate"), ("lr_scheduler_type",
                                        "train.lr_scheduler"), ("max_steps", "train.steps"), ("seed", "seed"),
                                        ("num_generations", "train.group_size"), ("beta", "divergence=kl")])
def test_the_refusal_names_the_typed_key(field, key):
    with pytest.raises(ValueError, match=rf"use {key}"):
        InnerConfig.from_dict(_trl(**{field: 1}))


def test_every_keyword_the_member_passes_is_either_owned_or_a_user_changeable_default(tmp_path):
    """A keyword we add to the member's GRPOConfig later must be refused in train.trl or documented as a default."""
    from inner_loop.grpo.args import grpo_kwargs

    kwargs, _ = grpo_kwargs(InnerConfig.from_dict(_inner()), tmp_path, 0, use_cpu=True, gpu_member=False)
    changeable = {"gradient_accumulation_steps", "use_cpu", "bf16", "disable_tqdm", "log_completions"}
    assert set(kwargs) - set(OWNED_FIELDS) == changeable


def test_report_to_is_set_through_its_typed_key():
    with pytest.raises(ValueError, match=r"train\.trl\.report_to") as error:
        InnerConfig.from_dict(_trl(report_to=["wandb"]))
    assert "train.report_to" in str(error.value)


def test_a_lr_scheduler_typo_fails_up_front_naming_the_key():
    inner = _inner(lr_scheduler="cosin")
    with pytest.raises(ValueError, match=r"^train\.lr_scheduler: rejected by TRL's GRPOConfig") as error:
        validate_inner(inner)
    assert "'cosine'" in str(error.value)  # TRL's list of the valid names comes with it


def test_a_valid_pass_through_reaches_grpo_config_intact(tmp_path):
    trl = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
           "vllm_enable_sleep_mode": True, "gradient_accumulation_steps": 4,
           "generation_kwargs": {"skip_special_tokens": False, "stop": ["\n\n"], "nested": {"a": [1, 2]}},
           "use_transformers_paged": False, "gradient_checkpointing": False, "adam_beta2": "9.5e-1"}
    # as the orchestrator hands it over: a resolved OmegaConf container turned into plain data
    inner = OmegaConf.to_container(OmegaConf.create(_inner(trl=trl, batch_size=64, group_size=8)), resolve=True)
    cfg = InnerConfig.from_dict(inner)
    assert cfg.train.trl["generation_kwargs"] == trl["generation_kwargs"]  # the nested mapping passed intact
    assert cfg.train.trl["adam_beta2"] == 0.95  # YAML 1.1 reads 9.5e-1 as a string: read as the number
    if VLLM_INSTALLED:  # without it the check refuses use_vllm (the test below)
        check_grpo_config(cfg)
    args = build_grpo_config(cfg, tmp_path / "out", seed=1)
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.3)
    assert args.vllm_enable_sleep_mode and args.adam_beta2 == 0.95
    assert args.generation_kwargs == trl["generation_kwargs"] and args.gradient_checkpointing is False
    # train.batch_size stays the completions per optimizer step: 4 micro-batches of 16, one generation batch of 64
    assert (args.gradient_accumulation_steps, args.per_device_train_batch_size) == (4, 16)
    assert args.generation_batch_size == 64


def test_vllm_generation_is_refused_up_front_where_vllm_is_not_installed(monkeypatch):
    import importlib.util

    cfg = InnerConfig.from_dict(_inner(trl={"use_vllm": True, "vllm_mode": "colocate"}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"^train\.trl\.use_vllm=true, but vLLM is not installed.*install_vllm"):
        check_grpo_config(cfg)
    check_grpo_config(InnerConfig.from_dict(_inner(trl={"use_vllm": False})))  # off: nothing to install


def test_a_batch_that_does_not_split_into_the_micro_batches_names_both_keys():
    with pytest.raises(ValueError, match=r"train\.batch_size \(256\) must be a multiple of "
                                         r"train\.trl\.gradient_accumulation_steps \(3\)"):
        InnerConfig.from_dict(_inner(trl={"gradient_accumulation_steps": 3}))
    with pytest.raises(ValueError, match=r"train\.trl\.gradient_accumulation_steps must be >= 1"):
        InnerConfig.from_dict(_inner(trl={"gradient_accumulation_steps": 0}))


def test_the_member_gets_the_args_the_check_built(tmp_path, monkeypatch):
    """The trainer receives the GRPOConfig of build_grpo_config, pass-through included (trainer stubbed out)."""
    import inner_loop.grpo.trainer as trainer
    import inner_loop.training.setup as run_setup

    captured = {}
    # (build_trainer imports the trainer class when it runs: the up-front check never loads the trainer's stack)
    monkeypatch.setattr(trainer, "MirrorGRPOTrainer", lambda **kwargs: captured.update(kwargs) or kwargs)
    inner = _inner(trl={"repetition_penalty": 1.2, "shuffle_dataset": False}, batch_size=16, group_size=4,
                   report_to=[])
    inner["model"].update(warmup_max_steps=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    run = run_setup.prepare(inner, seed=2, params=[0.0] * 380)
    run_setup.build_trainer(run, tmp_path / "m", seed=2)
    args = captured["args"]
    assert args.output_dir == str(tmp_path / "m" / "checkpoints") and args.report_to == []
    assert args.shuffle_dataset is False and args.repetition_penalty == 1.2 and args.seed == 2


def test_the_up_front_check_writes_nothing_and_opens_no_gpu(tmp_path, monkeypatch):
    """The check runs in the orchestrator: no file, and on a GPU node no CUDA context (it builds for the CPU)."""
    from inner_loop.grpo import args as grpo_args

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grpo_args, "_CHECK_OUTPUT_DIR", str(tmp_path / "never"))
    cfg = InnerConfig.from_dict(_inner(trl={"bf16": True, "use_cpu": False}))
    seen = []
    real = grpo_args._construct
    monkeypatch.setattr(grpo_args, "_construct", lambda kwargs: seen.append(dict(kwargs)) or real(kwargs))
    check_grpo_config(cfg)
    assert list(tmp_path.iterdir()) == []
    assert seen[0]["use_cpu"] is True and seen[0]["bf16"] is True
    assert not torch.cuda.is_initialized()


def test_meta_run_with_a_bad_train_trl_exits_2_before_writing_a_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "+train.trl.use_vlm=true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "train.trl.use_vlm is not a field of TRL's GRPOConfig" in proc.stderr
    assert "train.trl.use_vllm" in proc.stderr and not run_dir.exists()


@pytest.mark.parametrize("override, message", [("train.lr_scheduler=cosin", "train.lr_scheduler: rejected by TRL"),
                                               ("+train.trl.learning_rate=0.1", "use train.learning_rate"),
                                               ("++train.trl={use_vllm: true, vllm_mode: colocate}",
                                                None if VLLM_INSTALLED else "vLLM is not installed")])
def test_meta_run_checks_train_values_before_anything_is_written(tmp_path, capsys, override, message):
    from meta.search.run import main

    run_dir = tmp_path / "run"
    code = main([f"run_dir={run_dir}", "new=true", override, "dry_run=true"])
    err = capsys.readouterr().err
    if message is None:  # a valid pass-through: the dry run plans it
        assert code == 0, err
    else:
        assert code == 2 and message in err, err
    assert not run_dir.exists()


def test_the_up_front_check_leaves_the_trainer_s_stack_unloaded():
    """An orchestrator validates every member config (and a refused command line is answered) without loading the
    trainer: TRL's GRPOTrainer, the model loaders, and vLLM, which TRL's trainer imports whenever it is installed
    (seconds per process). Only the member's own job needs them."""
    code = ("import sys\n"
            "from conf_groups import load_group\n"
            "from inner_loop.training.setup import validate_inner\n"
            "validate_inner({g: load_group(g, n) for g, n in (('task', 'arith'), ('model', 'tiny'), "
            "('divergence', 'neural_mirror'), ('train', 'default'))})\n"
            "print(sorted(m for m in ('vllm', 'trl.trainer.grpo_trainer', 'inner_loop.grpo.trainer', "
            "'inner_loop.models.loading') if m in sys.modules))\n")
    tests = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=tests.parent, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tests)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
