"""The paper-setting presets in conf/experiment/ compose and pass the inner loop's up-front validation."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from inner_loop.training.setup import validate_inner
from meta.search.config import ConfigError, build_search_config
from core.gpu_time import gpu_sharing
from meta.compose import compose
from plan_inputs import ONE_MEMBER_AT_15S

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOCAL_DATA = {
    "mbpp_qwen3": [f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}", f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}",
                   "task.validation_size=2"],
    "gsm8k_qwen3": [f"task.train_file={FIXTURES / 'gsm8k_train.jsonl'}",
                    f"task.test_file={FIXTURES / 'gsm8k_test.jsonl'}", "task.validation_size=2"],
}


@pytest.mark.parametrize("experiment,task,group_size,steps", [("mbpp_qwen3", "mbpp", 32, 1600),
                                                             ("gsm8k_qwen3", "gsm8k", 4, 1000)])
def test_experiment_presets_select_the_authors_setting_and_validate(experiment, task, group_size, steps):
    raw = compose([f"experiment={experiment}", *LOCAL_DATA[experiment]])
    assert (raw["task"]["name"], raw["model"]["name"]) == (task, "qwen3_1_7b")
    assert (raw["train"]["group_size"], raw["train"]["steps"], raw["model"]["lora_r"]) == (group_size, steps, 64)
    cfg = build_search_config({**raw, "inner": {**raw["inner"], "entrypoint": "meta.synthetic:member"}})
    validate_inner(cfg.member_inner())  # data, splits, divergence and train settings all accepted


def test_command_line_overrides_win_over_a_preset():
    raw = compose(["experiment=gsm8k_qwen3", "train.steps=7", "divergence=prob_l2"])
    assert raw["train"]["steps"] == 7 and raw["divergence"]["name"] == "prob_l2"


def test_the_embedded_default_search_uses_the_tiny_arith_preset_and_presets_set_their_own_coefficient():
    default = compose([])
    assert (default["task"]["name"], default["model"]["name"], default["divergence"]["name"]) == (
        "arith", "tiny", "neural_mirror")
    assert default["divergence"]["coef"] == 1.0  # chosen by gradient share, like the Qwen3 presets
    assert compose(["experiment=mbpp_qwen3"])["divergence"]["coef"] == 10.0  # chosen by gradient share (#14)
    # GPU-cluster presets close a generation at its quorum (bench/bench_stragglers.py); the root default waits for all
    assert default["quorum"] == 1.0
    for preset in ("mbpp_qwen3", "gsm8k_qwen3"):
        raw = compose([f"experiment={preset}"])
        assert (raw["quorum"], raw["straggler_grace"]) == (0.9, 0.5)


# ----------------------------------------------------------------- resources and time per member (issue 13)
PRESETS = ("tiny_arith", "mbpp_qwen3", "gsm8k_qwen3")
CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.mark.parametrize("experiment", ["mbpp_qwen3", "gsm8k_qwen3"])
def test_gpu_presets_ask_slurm_for_one_gpu_their_threads_memory_and_time(experiment):
    raw = compose([f"experiment={experiment}", "launcher=slurm"])
    launcher, threads = raw["launcher"], raw["train"]["num_threads"]
    assert (launcher["gpus_per_node"], launcher["cpus_per_task"], launcher["mem_gb"]) == (1, threads, 32)
    assert threads == 4
    member_s = raw["resources"]["member_time_min"] * 60
    # k members sharing a card each run slower by the measured slowdown: the limit covers that
    sharing = gpu_sharing(raw["resources"])
    assert raw["inner"]["timeout_s"] == math.ceil(member_s * sharing.slowdown * raw["resources"]["timeout_factor"])
    assert raw["inner"]["timeout_s"] > member_s >= 2 * 3600
    from launch.slurm.options import SlurmOptions

    options = {k: v for k, v in launcher.items() if k not in ("name", "cls")}
    params = SlurmOptions.from_options(options).sbatch_parameters(raw["inner"]["timeout_s"])
    # a packed task holds one GPU with k members' CPUs and memory
    k = sharing.members_per_gpu
    assert params["gpus_per_node"] == 1 and params["cpus_per_task"] == 4 * k and params["mem"] == f"{32768 * k}M"
    assert params["time"] == math.ceil((raw["inner"]["timeout_s"] + launcher["kill_grace_s"]) / 60)


@pytest.mark.parametrize("experiment", PRESETS)
def test_every_preset_states_its_time_per_member_and_says_how_it_was_reached(experiment):
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text()
    preset = yaml.safe_load(text)
    resources = preset["resources"]
    assert (resources["member_time_min"] or 0) > 0 or (resources.get("step_time_s") or 0) > 0, resources
    assert "member_time_min" in text or "step_time_source" in text
    assert "measured" in text or "estimate" in text  # the comment says where the figure comes from


def test_the_embedded_default_asks_for_no_gpu_and_derives_its_timeout():
    raw = compose([])
    assert raw["resources"]["gpus"] == 0 and raw["launcher"]["name"] == "local"
    assert raw["launcher"]["gpus_per_node"] == 0  # local too: resources.gpus per member, here none
    assert raw["inner"]["timeout_s"] == 2 * 60 * 5.0
    assert compose(["launcher=slurm"])["launcher"]["gpus_per_node"] == 0


def test_command_line_launcher_resources_win_over_the_preset():
    raw = compose(["experiment=mbpp_qwen3", "launcher=slurm", "launcher.gpus_per_node=2", "launcher.mem_gb=80"])
    assert (raw["launcher"]["gpus_per_node"], raw["launcher"]["mem_gb"]) == (2, 80)
    assert compose(["experiment=mbpp_qwen3", "launcher=slurm", "resources.gpus=4", "resources.members_per_gpu=1"]
                   )["launcher"]["gpus_per_node"] == 4
    assert compose(["experiment=mbpp_qwen3", "inner.timeout_s=100"])["inner"]["timeout_s"] == 100


def _synthetic(raw):
    return {**raw, "inner": {**raw["inner"], "entrypoint": "meta.synthetic:member"}}


def test_slurm_cpus_below_the_member_threads_are_rejected_naming_both_keys():
    raw = compose(["experiment=mbpp_qwen3", "launcher=slurm", "launcher.cpus_per_task=1"])
    with pytest.raises(ConfigError, match=r"launcher.cpus_per_task=1 is smaller than train.num_threads=4"):
        build_search_config(_synthetic(raw))


def test_a_member_that_could_never_finish_within_its_requeues_is_rejected():
    # 10.3 h of running time (412 min x 1.5); 5 runs of 2 h cannot cover it, 6 runs can.
    raw = compose(["experiment=mbpp_qwen3", "launcher=slurm", "launcher.time_min=120", "launcher.requeues=4",
                   *ONE_MEMBER_AT_15S])
    assert raw["inner"]["timeout_s"] == 412 * 60 * 1.5
    with pytest.raises(ConfigError, match=r"launcher.requeues=4 \+ 1\) x launcher.time_min=120.*inner.timeout_s"):
        build_search_config(_synthetic(raw))
    ok = compose(["experiment=mbpp_qwen3", "launcher=slurm", "launcher.time_min=120", "launcher.requeues=5",
                  *ONE_MEMBER_AT_15S])
    assert build_search_config(_synthetic(ok)).inner.timeout_s == 412 * 60 * 1.5


def test_the_mbpp_preset_derives_its_time_from_the_measured_step_time():
    """The H200 pass of 2026-11-28 set the preset: the compiled static cache (2.62x the dynamic cache's step), its
    6.29 s/step, and two members per card (1.56x one member's tokens/s, each 1.277x slower)."""
    raw = compose(["experiment=mbpp_qwen3"])
    assert raw["train"]["decode_cache"] == "persistent_compiled"
    assert raw["resources"]["member_time_min"] == 180  # 1600 x 6.3 s = 168 min + 12 min
    assert raw["inner"]["timeout_s"] >= 1.3 * 180 * 1.277 * 60
    assert "H200" in raw["resources"]["step_time_source"]
    assert raw["resources"]["members_per_gpu"] == 2 and gpu_sharing(raw["resources"]).slowdown == 1.277
    assert "H200" in raw["resources"]["shared_slowdown_source"]
    assert compose(["experiment=mbpp_qwen3", "train.steps=800"])["resources"]["member_time_min"] == 96
    assert compose(["experiment=mbpp_qwen3", "resources.member_time_min=500"])["resources"]["member_time_min"] == 500
