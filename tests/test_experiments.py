"""The paper-setting presets in conf/experiment/ compose and pass the inner loop's up-front validation."""
from __future__ import annotations

from pathlib import Path

import pytest

from inner_loop.member import validate_inner
from meta.config import build_search_config
from meta.run import compose

FIXTURES = Path(__file__).resolve().parent / "fixtures"
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
    assert default["divergence"]["coef"] == 0.03
    assert compose(["experiment=mbpp_qwen3"])["divergence"]["coef"] == 1.0e-4
