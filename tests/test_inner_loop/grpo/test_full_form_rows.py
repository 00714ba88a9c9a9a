"""The full form's row chunk is sized from the member's own GPU budget (never the device's free memory, which counts
the members packed beside it), so Qwen3's vocabulary is not one row at a time."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inner_loop.generation.memory import private_pool_bytes
from inner_loop.grpo import trainer as trainer_module
from inner_loop.grpo.trainer import (FULL_FORM_BUDGET_BYTES, FULL_FORM_CUDA_FREE_FRACTION, MirrorGRPOTrainer,
                                full_form_budget_bytes, full_form_rows_for)

QWEN3_VOCAB = 151_936
GIB = 2**30


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, total: int = 80 * GIB, allocated: int = 0,
               segments: list[dict] | None = None) -> None:
    """A GPU of ``total`` bytes on which this member holds ``allocated`` in tensors and the allocator's ``segments``
    (torch.cuda.memory_snapshot()); its free memory is never to be asked."""
    def refuse(*args, **kwargs):
        raise AssertionError("the device's free memory was asked: it counts the other members packed on it")

    monkeypatch.setattr(torch.cuda, "mem_get_info", refuse)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *args, **kwargs: list(segments or []))


def _trainer_stub(device: str, vocab: int, rows: int | None = None) -> SimpleNamespace:
    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=vocab))
    accelerator = SimpleNamespace(device=torch.device(device), unwrap_model=lambda model: model)
    return SimpleNamespace(full_form_rows=rows, accelerator=accelerator, model=SimpleNamespace(config=config),
                           gpu_budget_bytes=None)


def test_cpu_keeps_the_fixed_budget(monkeypatch):
    _fake_cuda(monkeypatch)  # must not be consulted for the CPU
    assert full_form_budget_bytes(torch.device("cpu")) == FULL_FORM_BUDGET_BYTES
    assert MirrorGRPOTrainer._full_form_rows(_trainer_stub("cpu", QWEN3_VOCAB), 256) == 1


def test_cuda_budget_is_a_fraction_of_what_the_members_own_budget_leaves(monkeypatch):
    _fake_cuda(monkeypatch, total=80 * GIB, allocated=2 * GIB)
    assert full_form_budget_bytes(torch.device("cuda")) == int(FULL_FORM_CUDA_FREE_FRACTION * 78 * GIB)  # all of it
    assert full_form_budget_bytes(torch.device("cuda"), 40 * GIB) == int(FULL_FORM_CUDA_FREE_FRACTION * 38 * GIB)
    assert full_form_budget_bytes(torch.device("cuda"), GIB) == 0  # over its budget already: one row (below)


def _segment(pool: tuple[int, int], total: int, allocated: int) -> dict:
    return {"segment_pool_id": pool, "total_size": total, "allocated_size": allocated}


def test_a_cuda_graph_pool_held_through_the_backward_is_not_room(monkeypatch):
    """persistent_compiled: the decode step's CUDA graphs keep a private pool reserved from one replay to the next;
    its idle blocks serve no other tensor, so the chunks are sized from what is left beside them (the static cache,
    a live tensor, is in memory_allocated already); the default pool's idle blocks stay room."""
    pools = [_segment((0, 0), 6 * GIB, 2 * GIB),   # the default pool: 4 GiB cached, reusable
             _segment((1, 7), 3 * GIB, GIB)]       # a CUDA graph's pool: 3 GiB reserved, 2 of them idle
    assert private_pool_bytes(pools) == (3 * GIB, 2 * GIB)
    _fake_cuda(monkeypatch, total=80 * GIB, allocated=10 * GIB, segments=pools)
    assert full_form_budget_bytes(torch.device("cuda"), 40 * GIB) == int(FULL_FORM_CUDA_FREE_FRACTION * 28 * GIB)


def test_qwen3_vocabulary_gets_many_rows_per_chunk_on_a_roomy_gpu(monkeypatch):
    _fake_cuda(monkeypatch, total=40 * GIB)
    rows = MirrorGRPOTrainer._full_form_rows(_trainer_stub("cuda", QWEN3_VOCAB), 256)
    per_row = 2 * 256 * QWEN3_VOCAB * 4
    assert rows == int(FULL_FORM_CUDA_FREE_FRACTION * 40 * GIB) // per_row
    assert rows >= 30  # the fixed 512 MiB gave 1
    assert rows * per_row <= 40 * GIB * FULL_FORM_CUDA_FREE_FRACTION


def test_a_nearly_full_budget_still_gets_one_row_and_config_wins(monkeypatch):
    _fake_cuda(monkeypatch, total=80 * GIB, allocated=80 * GIB - 64 * 2**20)
    assert MirrorGRPOTrainer._full_form_rows(_trainer_stub("cuda", QWEN3_VOCAB), 256) == 1
    assert MirrorGRPOTrainer._full_form_rows(_trainer_stub("cuda", QWEN3_VOCAB, rows=3), 256) == 3


def test_rows_for_budget_arithmetic():
    assert full_form_rows_for(8 * 10 * 100 * 4, 10, 100) == 4
    assert full_form_rows_for(0, 10, 100) == 1
    assert trainer_module.full_form_rows_for(10**12, 0, 100) >= 1  # an empty completion does not divide by zero
