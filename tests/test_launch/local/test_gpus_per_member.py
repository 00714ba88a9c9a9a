"""A member trains on one GPU: more than one is refused up front (exit 2, nothing written), never left to crash.

With several GPUs visible and no distributed launch, HF Trainer wraps the policy in nn.DataParallel, which TRL's
GRPO does not support; every member of the search would fail after its set-up. Multi-GPU (DDP) members are not
built, so the search says so before submitting anything, naming the key and the fix (one member per GPU).
"""
from __future__ import annotations

import pytest
from conf_groups import load_group

from launch.slurm.launcher import SlurmLauncher
from launch.local.launchers import LocalLauncher
from launch.submitit_base import check_gpus_per_member
from meta.search.run import main

SYNTH = ["inner.entrypoint=meta.synthetic:member", "dry_run=true"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_zero_or_one_gpu_per_member_is_accepted(gpus):
    check_gpus_per_member("launcher.gpus_per_node", gpus)
    LocalLauncher.validate_options({"gpus_per_node": gpus, "visible_gpus": [0]})


def test_local_launcher_refuses_two_gpus_per_member():
    with pytest.raises(ValueError, match=r"launcher.gpus_per_node=2: a member trains on ONE GPU.*one member per GPU"):
        LocalLauncher.validate_options({"gpus_per_node": 2, "visible_gpus": [0, 1]})


def test_local_null_with_several_visible_gpus_is_refused_for_a_training_search(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    LocalLauncher.validate_options({"gpus_per_node": None})  # the launcher's pass-through itself stays valid
    with pytest.raises(ValueError, match=r"gpus_per_node=null passes this process's 2 GPUs.*visible_gpus"):
        LocalLauncher.check_training_member_gpus({"gpus_per_node": None})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    LocalLauncher.check_training_member_gpus({"gpus_per_node": None})
    LocalLauncher.check_training_member_gpus({"gpus_per_node": 1, "visible_gpus": [2]})


@pytest.mark.parametrize("override, key", [("resources.gpus=2", "launcher.gpus_per_node=2"),
                                           ("launcher.gpus_per_node=4", "launcher.gpus_per_node=4")])
def test_slurm_search_with_multi_gpu_members_exits_2_before_writing(tmp_path, capsys, override, key):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=slurm", override, *SYNTH]) == 2
    err = capsys.readouterr().err
    assert f"{key}: a member trains on ONE GPU" in err and "resources.gpus" in err, err
    assert not run_dir.exists()


def test_local_search_with_two_gpus_in_resources_exits_2(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "resources.gpus=2", *SYNTH]) == 2
    err = capsys.readouterr().err
    assert "launcher.gpus_per_node=2: a member trains on ONE GPU" in err and "from resources.gpus" in err, err
    assert not run_dir.exists()


def test_local_search_with_null_and_two_visible_gpus_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert main([f"run_dir={tmp_path / 'run'}", "new=true", "launcher.gpus_per_node=null", *SYNTH]) == 2
    assert "passes this process's 2 GPUs" in capsys.readouterr().err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert main([f"run_dir={tmp_path / 'one'}", "new=true", "launcher.gpus_per_node=1", "launcher.visible_gpus=[1]", *SYNTH]) == 0


def test_slurm_validate_options_refuses_directly():
    options = load_group("launcher", "slurm", resolve=False)
    options = {k: v for k, v in options.items() if k not in ("name", "cls")}
    options.update(cpus_per_task=1, mem_gb=None, gpus_per_node=1, members_per_gpu=1)  # the preset's ${resources.*}, resolved
    SlurmLauncher.validate_options(options)
    options["gpus_per_node"] = 2
    with pytest.raises(ValueError, match="ONE GPU"):
        SlurmLauncher.validate_options(options)
