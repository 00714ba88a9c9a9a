"""A member's numbers do not depend on what ran before it in its process, and a member resumed from its own
checkpoint continues bitwise as if it had never stopped (issue 52, item 4).

The cause found: PEFT drew a LoRA adapter's A matrices from torch's global generator before the Trainer seeded it,
so the first member of a process (global state: the process's start) and the members after it (global state: what
the previous member's training left) started from different adapters. Step 1 agrees (B = 0 hides A); the losses part
from step 2 on. inner_loop/models/loading.py now draws the adapter from the member's seed alone."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from inner_loop.config import ModelConfig
from inner_loop.member.lifecycle import train_in_process
from inner_loop.models.loading import load_policy, resolve_model_dir
from inner_loop.tasks.arith import ArithTask
from helpers import inner_config, member_spec, SMALL_UNWARMED

STEPS = 8


@pytest.fixture(autouse=True)
def varying_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward the untrained tiny model varies on, so that the policy (and the adapter's B) moves from step 1."""
    monkeypatch.setattr(ArithTask, "score", lambda self, problem, completion:
                        sum(c.isdigit() for c in completion) / max(len(completion), 1))


def _inner(**train: Any) -> dict[str, Any]:
    return inner_config("kl", model_keys={**SMALL_UNWARMED, "lora_r": 4}, **{
        "steps": STEPS, "batch_size": 8, "group_size": 4, "val_size": 8, "max_completion_length": 6, "report_to": [],
        "save_every": STEPS, "keep_checkpoints": "last", **train})


def _spec(work_dir: Path, inner: dict[str, Any]) -> dict[str, Any]:
    return member_spec(work_dir, inner, run_id="same", seed=5)


def _steps(work_dir: Path) -> list[tuple]:
    """(step, loss, reward, regularizer) of every logged step, from the last checkpoint's trainer state."""
    state = json.loads(next(work_dir.rglob("trainer_state.json")).read_text())
    return [(h["step"], h["loss"], h["reward"], h.get("regularizer/value")) for h in state["log_history"]
            if "loss" in h]


def _weights(work_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next(work_dir.rglob("adapter_model.safetensors"))))


def _assert_same_run(a: Path, b: Path) -> None:
    assert len(_steps(a)) == STEPS and _steps(a) == _steps(b)
    first, second = _weights(a), _weights(b)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_lora_adapters_init_comes_from_the_seed_alone_and_leaves_the_global_generator_as_it_was():
    cfg = ModelConfig(**{**SMALL_UNWARMED, "lora_r": 4})
    path = resolve_model_dir(cfg)

    def adapter(seed: int, global_seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(global_seed)  # whatever ran before in the process
        model, _ = load_policy(cfg, path, seed)
        after = torch.rand(3)
        torch.manual_seed(global_seed)
        assert torch.equal(after, torch.rand(3))  # the global generator is where it was
        return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_A" in k}

    one, other_history, other_seed = adapter(5, 0), adapter(5, 1234), adapter(6, 0)
    assert one and all(torch.equal(one[k], other_history[k]) for k in one)
    assert any(not torch.equal(one[k], other_seed[k]) for k in one)


def test_the_same_member_trained_twice_in_one_process_gives_the_same_steps_and_weights(tmp_path: Path):
    inner = _inner()
    torch.manual_seed(1)  # the process's history before the first member
    first = train_in_process(_spec(tmp_path / "first", inner))
    torch.rand(17)  # and more of it before the second
    second = train_in_process(_spec(tmp_path / "second", inner))
    assert first.status == second.status == "ok", (first.error, second.error)
    _assert_same_run(tmp_path / "first", tmp_path / "second")
    assert first.generation["completions_sha256"] == second.generation["completions_sha256"]
    numbers = ("reward_mean", "regularizer_value", "regularizer_grad_share")  # the diagnostics that are not timings
    assert (first.fitness, *(first.diagnostics[k] for k in numbers)) == \
        (second.fitness, *(second.diagnostics[k] for k in numbers))


def test_a_member_stopped_after_a_checkpoint_and_resumed_continues_bitwise(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    import inner_loop.member.lifecycle as lifecycle

    inner = _inner(save_every=3)
    straight = train_in_process(_spec(tmp_path / "straight", inner))
    assert straight.status == "ok", straight.error
    real = lifecycle.MirrorGRPOTrainer.training_step
    calls: list[int] = []

    def killed_at_step_five(self, *args, **kwargs):  # after checkpoint-3, with step 4 done past it
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # not an Exception: no record is written, as after a kill
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lifecycle.MirrorGRPOTrainer, "training_step", killed_at_step_five)
    work = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        train_in_process(_spec(work, inner))
    assert not (work / "result.json").exists() and (work / "checkpoints" / "checkpoint-3").is_dir()
    monkeypatch.setattr(lifecycle.MirrorGRPOTrainer, "training_step", real)
    torch.rand(5)  # another history before the rerun
    resumed = train_in_process(_spec(work, inner))
    assert resumed.status == "ok", resumed.error
    _assert_same_run(tmp_path / "straight", work)
    assert (resumed.fitness, resumed.steps_done) == (straight.fitness, straight.steps_done)
