"""train.decode_cache: a real tiny member decoding with HF generate's static KV cache, on the CPU.

Why these checks: the static cache is meant as a speed setting only. A member with it must still train and a seed
must still reproduce its completions (the seed noise of a search rests on that), greedy decoding must give the
very completions of the dynamic cache (the same model must answer the same), and the cache transformers actually
builds is spied on, so a setting silently dropped on its way to ``generate`` cannot pass; ``static`` keeps TRL's
``disable_compile`` (an eager decode step). transformers' own compiled static cache (``static_compiled``) is refused
up front (inner_loop/generation/backends.py says why); tests/test_inner_loop/generation/test_decode_step.py tests the
compiled setting.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from inner_loop.training.checkpoints import CHECKPOINT_DIR
from inner_loop.config import TrainConfig
from helpers import inner_config, SMALL_UNWARMED


def _inner(decode_cache: str, lora_r: int = 0, **train: Any) -> dict[str, Any]:
    """Untrained (no warm-up) and small: the member's stages and its generation are the point, not its answers."""
    return inner_config("neural_mirror", model_keys={**SMALL_UNWARMED, "lora_r": lora_r}, **{
        "steps": 1, "batch_size": 8, "group_size": 4, "val_size": 8, "max_completion_length": 6, "report_to": [],
        "decode_cache": decode_cache, **train})


def _member(tmp_path: Path, name: str, inner: dict[str, Any]) -> Any:
    from inner_loop.member.lifecycle import train_in_process

    return train_in_process({"run_id": "cache", "generation": 0, "index": 0, "seed": 0, "params": [],
                         "work_dir": str(tmp_path / name), "inner": inner})


@pytest.fixture
def generate_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool | None]]:
    """(the KV cache's class, the GenerationConfig's disable_compile) of every decoding loop transformers ran."""
    from transformers.generation.utils import GenerationMixin

    calls: list[tuple[str, bool | None]] = []
    real = GenerationMixin._valid_auto_compile_criteria

    def recorded(self: Any, model_kwargs: dict[str, Any], generation_config: Any) -> bool:
        cache = model_kwargs.get("past_key_values")
        calls.append((type(cache).__name__, generation_config.disable_compile))
        return real(self, model_kwargs, generation_config)

    monkeypatch.setattr(GenerationMixin, "_valid_auto_compile_criteria", recorded)
    return calls


def _static(calls: list[tuple[str, bool | None]]) -> list[bool | None]:
    return [disable for cache, disable in calls if cache == "StaticCache"]


def test_a_static_cache_member_with_lora_trains_and_its_seed_reproduces_its_completions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generate_calls: list[tuple[str, bool | None]]) -> None:
    from inner_loop.tasks.arith import ArithTask

    # a reward the untrained model varies on (the share of digits it writes), so step 1 changes the adapter and
    # step 2 samples from the trained policy: the reproduction covers training, not only the initial weights
    monkeypatch.setattr(ArithTask, "score", lambda self, problem, completion:
                        sum(c.isdigit() for c in completion) / max(len(completion), 1))
    inner = _inner("static", lora_r=4, steps=2, save_every=2, keep_checkpoints="last")
    first = _member(tmp_path, "first", inner)
    assert first.status == "ok", first.error
    assert first.steps_done == 2 and math.isfinite(first.fitness)
    assert first.generation["backend"] == "hf_generate" and first.generation["decode_cache"] == "static"
    # one static cache per training step; validation keeps the model's own (dynamic) cache
    assert _static(generate_calls) == [True, True]
    history = json.loads((tmp_path / "first" / CHECKPOINT_DIR / "checkpoint-2" / "trainer_state.json").read_text())
    steps = [h for h in history["log_history"] if "loss" in h and "grad_norm" in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps)
    assert any(h["grad_norm"] > 0 for h in steps)  # it learned something, so step 2's policy is not the initial one
    again = _member(tmp_path, "again", inner)
    assert again.status == "ok", again.error
    assert again.generation["completions_sha256"] == first.generation["completions_sha256"]
    assert len(_static(generate_calls)) == 4


def test_greedy_completions_with_a_static_cache_equal_the_dynamic_caches(
        tmp_path: Path, generate_calls: list[tuple[str, bool | None]]) -> None:
    greedy = {"trl": {"generation_kwargs": {"do_sample": False}}}
    records = {cache: _member(tmp_path, cache, _inner(cache, **greedy)) for cache in ("dynamic", "static")}
    assert all(r.status == "ok" for r in records.values()), {c: r.error for c, r in records.items()}
    assert {c: r.generation["decode_cache"] for c, r in records.items()} == {c: c for c in records}
    digests = {c: r.generation["completions_sha256"] for c, r in records.items()}
    assert digests["static"] == digests["dynamic"], digests
    # static: TRL's eager decode step (compilation kept disabled); dynamic: no static cache at all
    assert _static(generate_calls) == [True]


def test_the_setting_is_checked_up_front_naming_its_key() -> None:
    with pytest.raises(ValueError, match=r"train.decode_cache='statik' is not one of"):
        TrainConfig(decode_cache="statik").validate()
    with pytest.raises(ValueError, match=r"train.decode_cache='static' applies to HF generate only.*"
                                         r"transformers_continuous_batching"):
        TrainConfig(decode_cache="static", trl={"use_transformers_continuous_batching": True}).validate()
    with pytest.raises(ValueError, match=r"train.trl.cache_implementation is set by mirror-es itself; use "
                                         r"train.decode_cache"):
        TrainConfig(trl={"cache_implementation": "static"}).validate()
    with pytest.raises(ValueError, match=r"train.trl.generation_kwargs.disable_compile .*train.decode_cache"):
        TrainConfig(trl={"generation_kwargs": {"disable_compile": False}}).validate()
    TrainConfig(trl={"use_transformers_continuous_batching": True}).validate()  # the default goes with every backend


@pytest.mark.parametrize("decode_cache, expected", [("dynamic", None), ("static", "static"),
                                                     ("persistent_compiled", "static")])
def test_grpo_config_carries_the_cache(decode_cache: str, expected: str | None) -> None:
    from inner_loop.config import InnerConfig
    from inner_loop.grpo.args import build_grpo_config

    cfg = InnerConfig.from_dict(_inner(decode_cache))
    assert build_grpo_config(cfg, "unused", 0, check_only=True).cache_implementation == expected
